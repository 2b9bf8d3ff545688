"""RetinaFace files: the backbone told from keys and shapes (facexlib's state dicts as the shipped
graphs' manifests record them, ``fixtures/families/manifest.json``), wrapper prefixes dropped,
foreign files not taken, ``.pth`` refused unread."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from sdkit.errors import ModelFormatError
from sdkit.families import retinaface
from sdkit.families.retinaface import RetinaFaceConfig, RetinaFaceFile, find_graph, sniff

MANIFEST = json.loads(
    (Path(__file__).resolve().parents[4] / "fixtures" / "families" / "manifest.json").read_text(encoding="utf-8")
)
GRAPHS = {"resnet50": "retinaface_resnet50", "mobilenet0.25": "retinaface_mobilenet025"}


def shapes(backbone: str, prefix: str = "") -> dict[str, tuple[int, ...]]:
    return {prefix + k: tuple(v) for k, v in MANIFEST[GRAPHS[backbone]].items()}


@pytest.mark.parametrize("backbone", sorted(GRAPHS))
@pytest.mark.parametrize("prefix", ["", "module."])
def test_backbone_is_told_from_keys_and_shapes(backbone: str, prefix: str) -> None:
    found = sniff(shapes(backbone, prefix))
    assert found == RetinaFaceConfig(backbone)
    assert found.graph_name == GRAPHS[backbone]
    # a converted .pth also holds BatchNorm's num_batches_tracked: still the same file
    with_counters = {**shapes(backbone, prefix), f"{prefix}body.bn1.num_batches_tracked": ()}
    assert sniff(with_counters) == RetinaFaceConfig(backbone)


def test_foreign_or_odd_files_are_not_taken() -> None:
    assert sniff({}) is None
    assert sniff(MANIFEST["esrgan_nf64_nb23_x4"]) is None
    assert sniff({"model.0.weight": (64, 3, 3, 3)}) is None
    odd = shapes("resnet50")
    odd["ClassHead.0.conv1x1.weight"] = (6, 256, 1, 1)  # three anchors: not facexlib's
    assert sniff(odd) is None
    mixed = shapes("mobilenet0.25", "module.")
    mixed["fpn.output1.0.weight"] = (64, 64, 1, 1)  # one key without the prefix
    assert sniff(mixed) is None
    assert sniff({"ClassHead.0.conv1x1.weight": "not a shape"}) is None  # type: ignore[dict-item]


def test_pth_is_refused_unread_with_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "detection_Resnet50_Final.pth"
    path.write_bytes(b"\x80\x04 not read")
    with pytest.raises(ModelFormatError) as info:
        RetinaFaceFile(path)
    message = str(info.value)
    assert "weights_only=True" in message and "removeprefix('module.')" in message
    assert "detection_Resnet50_Final.safetensors" in message


def test_a_foreign_safetensors_file_and_a_truncated_one_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "esrgan.safetensors"
    save_file({"model.0.weight": np.zeros((4, 3, 3, 3), np.float32)}, str(foreign))
    with pytest.raises(ModelFormatError, match="not a RetinaFace file"):
        RetinaFaceFile(foreign)
    values = {k: np.zeros(v, np.float32) for k, v in shapes("mobilenet0.25").items()}
    values.pop("ssh2.conv3X3.0.weight")
    truncated = tmp_path / "truncated.safetensors"
    save_file(values, str(truncated))
    file = RetinaFaceFile(truncated)
    try:
        with pytest.raises(ModelFormatError, match="missing"):
            file.weights(find_graph(file.config))
    finally:
        file.close()


def test_shipped_graphs_are_listed() -> None:
    assert retinaface.retinaface_graph_names() == sorted(GRAPHS.values())
