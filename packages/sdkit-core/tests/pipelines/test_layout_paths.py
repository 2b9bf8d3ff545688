"""Every file read from a pipeline folder stays inside it once symlinks are resolved (issue 15,
deliverable 5), except links into a Hugging Face cache's blobs/ (its snapshots are links)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sdkit.errors import ModelFormatError
from sdkit.pipelines.loaders.diffusers_folder import read_folder


@pytest.mark.parametrize("relative", ["unet/model.onnx", "tokenizer/vocab.json", "vae_decoder/config.json"])
def test_a_link_out_of_the_folder_is_refused(relative: str, tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for a model to read")
    (copy / relative).unlink()
    (copy / relative).symlink_to(secret)
    with pytest.raises(ModelFormatError, match="points outside its folder"):
        read_folder(copy)


def test_links_inside_the_folder_and_a_linked_folder_are_fine(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    (copy / "spare.json").write_bytes((copy / "unet" / "config.json").read_bytes())
    (copy / "unet" / "config.json").unlink()
    (copy / "unet" / "config.json").symlink_to(copy / "spare.json")
    linked = tmp_path / "linked"
    linked.symlink_to(copy, target_is_directory=True)
    assert read_folder(linked).configs["unet"]


def test_hugging_face_cache_layout_is_read(tiny_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    for index, file in enumerate(sorted(p for p in tiny_dir.rglob("*") if p.is_file())):
        blob = blobs / f"blob{index}"
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(tiny_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(link.relative_to(repo).parts) - 1)) / "blobs" / blob.name)
    assert read_folder(snapshot).model_files["unet"].resolve().parent == blobs.resolve()


@pytest.mark.parametrize("attack", ["blobs is a link to /", "a blob is a link out", "a link into a blob's subfolder"])
def test_the_hugging_face_exception_reaches_only_real_blobs(attack: str, tiny_dir: Path, tmp_path: Path) -> None:
    """Issue 30, item 10: ``<repo>/blobs`` linked to ``/`` made ``/etc/passwd`` a blob (and its
    first line was printed in the error). Only regular files directly inside the repository's
    own ``blobs`` folder are the exception."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    shutil.copytree(tiny_dir, snapshot)
    secret = tmp_path / "outside" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"_class_name": "root:x:0:0:root:/root:/bin/bash"}')
    target = snapshot / "unet" / "config.json"
    target.unlink()
    if attack == "blobs is a link to /":
        (repo / "blobs").symlink_to(secret.parent, target_is_directory=True)
        target.symlink_to(Path("../../../blobs") / secret.name)
    elif attack == "a blob is a link out":
        (repo / "blobs").mkdir()
        (repo / "blobs" / "abc").symlink_to(secret)
        target.symlink_to(Path("../../../blobs/abc"))
    else:
        (repo / "blobs" / "sub").mkdir(parents=True)
        shutil.copyfile(secret, repo / "blobs" / "sub" / "abc")
        target.symlink_to(Path("../../../blobs/sub/abc"))
    with pytest.raises(ModelFormatError, match="points outside its folder") as refused:
        read_folder(snapshot)
    assert "root:x" not in str(refused.value)
