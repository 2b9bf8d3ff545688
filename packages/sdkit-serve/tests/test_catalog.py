"""The model catalogue (``--ckpt-dir``, ``--vae-dir``) named as A1111 names models, the
per-request model fields, and png-info's parser: no server, no model loaded."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from model_helpers import TINY_FAMILIES, copy_into, write_variant

from sdkit.errors import InputError
from sdkit_serve.a1111 import Txt2ImgRequest, override_fields
from sdkit_serve.catalog import ModelCatalog, legacy_hash
from sdkit_serve.infotext import memory_report, parse_infotext
from sdkit_serve.model_choice import ModelChoice, model_request

SD1 = TINY_FAMILIES / "sd1" / "sd1_fp16.safetensors"
VAE = TINY_FAMILIES / "sd1" / "vae" / "vae_ldm_fp16.safetensors"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An A1111 models folder: checkpoints in subfolders, a VAE beside its checkpoint, a pipeline
    folder, a hidden folder, links inside and outside; a VAE folder; a file outside both."""
    ckpt, vae, outside = tmp_path / "Stable-diffusion", tmp_path / "VAE", tmp_path / "elsewhere"
    copy_into(SD1, ckpt / "top.safetensors")
    write_variant(SD1, ckpt / "sub" / "deep.safetensors")  # other weights: other hashes
    copy_into(VAE, ckpt / "sub" / "deep.vae.safetensors")
    (ckpt / "pipe" / "unet").mkdir(parents=True)
    (ckpt / "pipe" / "model_index.json").write_text("{}")
    (ckpt / "pipe" / "unet" / "inner.safetensors").write_bytes(b"not scanned: inside a pipeline folder")
    copy_into(SD1, ckpt / ".trash" / "hidden.safetensors")
    (ckpt / "notes.txt").write_text("not a model")
    copy_into(SD1, outside / "secret.safetensors")
    (ckpt / "link_out.safetensors").symlink_to(outside / "secret.safetensors")
    (ckpt / "link_in.safetensors").symlink_to(ckpt / "top.safetensors")
    copy_into(VAE, vae / "anime" / "kl-f8.safetensors")
    copy_into(VAE, vae / "top.safetensors")
    return ckpt, vae, outside


def test_names_titles_and_listing_follow_a1111(folders: tuple[Path, Path, Path], tmp_path: Path) -> None:
    ckpt, vae, _ = folders
    catalog = ModelCatalog(ckpt_dir=ckpt, vae_dir=vae, hash_cache=tmp_path / "hashes.json")
    assert list(catalog.checkpoints) == ["link_in.safetensors", "pipe", "sub/deep.safetensors", "top.safetensors"]
    deep = catalog.checkpoints["sub/deep.safetensors"]
    assert (deep.model_name, deep.stem, deep.shorthash) == ("sub_deep", "deep", None)
    assert deep.title == "sub/deep.safetensors"  # no hash yet: A1111's title is the name
    assert deep.legacy_hash == legacy_hash(ckpt / "sub" / "deep.safetensors")
    big = tmp_path / "big.bin"  # A1111's old hash: sha256 of the 64 KiB at 1 MiB, 8 digits
    big.write_bytes(bytes(range(256)) * 5000)
    assert legacy_hash(big) == hashlib.sha256(big.read_bytes()[0x100000:0x110000]).hexdigest()[:8]
    assert catalog.checkpoints["pipe"].item() == {
        "title": "pipe", "model_name": "pipe", "hash": None, "sha256": None, "filename": "pipe", "config": None,
    }  # fmt: skip
    assert list(catalog.vaes) == ["deep.vae.safetensors", "kl-f8.safetensors", "top.safetensors"]

    # A1111 hashes a model when it first loads it; the title then carries the short hash.
    hashed = catalog.hashed(deep)
    sha = hashlib.sha256((ckpt / "sub" / "deep.safetensors").read_bytes()).hexdigest()
    assert hashed.sha256 == sha and hashed.title == f"sub/deep.safetensors [{sha[:10]}]"
    assert catalog.checkpoints["sub/deep.safetensors"].item()["hash"] == sha[:10]
    again = ModelCatalog(ckpt_dir=ckpt, hash_cache=tmp_path / "hashes.json")  # a restart: read from the cache
    assert again.checkpoints["sub/deep.safetensors"].sha256 == sha
    copy_into(SD1, ckpt / "sub" / "deep.safetensors")  # changed: its hash is unknown again
    changed = ModelCatalog(ckpt_dir=ckpt, hash_cache=tmp_path / "hashes.json")
    assert changed.checkpoints["sub/deep.safetensors"].sha256 is None


@pytest.mark.parametrize(
    "text",
    ["sub/deep.safetensors", "sub_deep", "deep", "sub/deep.safetensors [{short}]", "{short}", "{sha}",
     "deep [{short}]", "sub/deep.safetensors [0000000000]", "sub\\deep.safetensors"],
)  # fmt: skip
def test_a_model_is_found_by_every_name_a1111_accepts(folders: tuple[Path, Path, Path], text: str) -> None:
    ckpt, _, _ = folders
    catalog = ModelCatalog(ckpt_dir=ckpt)
    deep = catalog.hashed(catalog.checkpoints["sub/deep.safetensors"])
    name = text.format(short=deep.shorthash, sha=deep.sha256)
    assert catalog.find(name).name == "sub/deep.safetensors"


@pytest.mark.parametrize(
    "text",
    ["link_out.safetensors", "link_out", "../elsewhere/secret.safetensors", "{outside}/secret.safetensors",
     "hidden", "pipe/unet/inner.safetensors", "notes.txt", "", "de"],
)  # fmt: skip
def test_names_outside_the_folders_are_refused(folders: tuple[Path, Path, Path], text: str) -> None:
    ckpt, _, outside = folders
    catalog = ModelCatalog(ckpt_dir=ckpt)
    with pytest.raises(InputError, match="unknown model"):
        catalog.find(text.format(outside=outside))
    assert catalog.find("de", closest=True).name == "sub/deep.safetensors"  # A1111's closest title match


def test_a_file_replaced_by_a_link_out_after_the_scan_is_refused(folders: tuple[Path, Path, Path]) -> None:
    ckpt, _, outside = folders
    catalog = ModelCatalog(ckpt_dir=ckpt)
    top = catalog.find("top")
    (ckpt / "top.safetensors").unlink()
    (ckpt / "top.safetensors").symlink_to(outside / "secret.safetensors")
    with pytest.raises(InputError, match="outside its folder"):
        top.checked_path()
    catalog.refresh_checkpoints()
    assert "top.safetensors" not in catalog.checkpoints


def test_sd_vae_values(folders: tuple[Path, Path, Path]) -> None:
    ckpt, vae, _ = folders
    catalog = ModelCatalog(ckpt_dir=ckpt, vae_dir=vae)
    deep, top = catalog.find("deep"), catalog.find("top")
    assert catalog.vae("None", deep) is None
    found = catalog.vae("Automatic", deep)  # a VAE named after the checkpoint (A1111's Automatic)
    assert found is not None and found.name == "deep.vae.safetensors"
    automatic_top = catalog.vae("Automatic", top)
    assert automatic_top is not None and automatic_top.name == "top.safetensors"
    assert catalog.vae("Automatic", catalog.find("pipe")) is None
    named = catalog.vae("kl-f8.safetensors", top)
    assert named is not None and named.path == (vae / "anime" / "kl-f8.safetensors").resolve()
    assert catalog.check_vae_option("kl-f8") == "kl-f8.safetensors"
    for bad in ("../VAE/top.safetensors", str(vae / "top.safetensors"), "nope"):
        with pytest.raises(InputError, match="unknown VAE"):
            catalog.vae(bad, top)


def test_per_request_model_fields(folders: tuple[Path, Path, Path]) -> None:
    ckpt, vae, _ = folders
    catalog = ModelCatalog(ckpt_dir=ckpt, vae_dir=vae)
    selected = ModelChoice("top.safetensors", "None")

    def request(**fields: Any) -> Any:
        return model_request(Txt2ImgRequest(**fields), catalog, selected)

    assert request().choice == selected and not request().persist
    override = request(override_settings={"sd_model_checkpoint": "deep", "sd_vae": "kl-f8.safetensors"})
    assert override.choice == ModelChoice("sub/deep.safetensors", "kl-f8.safetensors") and not override.persist
    kept = request(override_settings={"sd_model_checkpoint": "deep"}, override_settings_restore_afterwards=False)
    assert kept.persist and kept.choice.vae == "None"
    refined = request(refiner_checkpoint="link_in", refiner_switch_at=0.8)
    assert (refined.refiner, refined.refiner_switch_at) == ("link_in.safetensors", 0.8)
    assert request(refiner_checkpoint="None").refiner is None
    for fields, message in (
        ({"override_settings": {"sd_model_checkpoint": "../elsewhere/secret"}}, "unknown model"),
        ({"override_settings": {"sd_vae": "nope"}}, "unknown VAE"),
        ({"refiner_checkpoint": "top"}, "needs refiner_switch_at"),
        ({"refiner_checkpoint": "top", "refiner_switch_at": 1.0}, "between 0 and 1"),
    ):
        with pytest.raises(InputError, match=message):
            request(**fields)
    # what a1111.override_fields reports: neither the model keys (taken above) nor clip skip
    fields = override_fields(
        {"sd_vae": "None", "CLIP_stop_at_last_layers": 2, "sd_model_checkpoint": "top", "eta_ddim": 0.5}
    )
    assert fields.generate == {"clip_skip": 2}
    assert fields.ignored == {"override_settings.eta_ddim": "this setting is not applied per request"}


def test_png_info_parses_what_sdkit_and_a1111_write() -> None:
    from sdkit.pipelines import GenerationParameters

    ours = GenerationParameters("a cat, red", "blurry", 20, "euler_a", "karras", 7.5, 42, 512, 768, "sd15").a1111_text()
    parsed = parse_infotext(ours)
    assert parsed["Prompt"] == "a cat, red" and parsed["Negative prompt"] == "blurry"
    assert (parsed["Steps"], parsed["Seed"], parsed["Size-1"], parsed["Size-2"]) == ("20", "42", "512", "768")
    assert parsed["Sampler"] == "Euler a" and parsed["Model"] == "sd15"
    # A1111's own text: a multi-line prompt, a JSON-quoted value
    a1111 = 'line one\nline two\nNegative prompt: bad\nSteps: 4, Sampler: DPM++ 2M, Lora hashes: "a: 1, b: 2", Seed: 1'
    parsed = parse_infotext(a1111)
    assert parsed["Prompt"] == "line one\nline two" and parsed["Lora hashes"] == "a: 1, b: 2"
    assert parse_infotext("just a prompt") == {"Prompt": "just a prompt", "Negative prompt": ""}
    ram = memory_report()["ram"]
    assert ("error" in ram) or (0 < ram["used"] < ram["total"] and ram["free"] == ram["total"] - ram["used"])
