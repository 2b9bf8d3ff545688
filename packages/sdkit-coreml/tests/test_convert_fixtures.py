"""Every fixture graph converts to an .mlpackage that loads back with the right I/O and the
expected ML program ops. Linux: conversion and the saved package only (no Core ML runtime)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from coreml_helpers import FIXTURES, fixture_model, needs_coremltools

from sdkit_coreml import export_mlpackage

# The ops each static-shape fp32 package must contain (all counts exact): GroupNorm arrives as
# reshape + layer_norm + affine (coremltools folds the per-channel affine into batch_norm),
# attention as matmul + softmax, and the shape arithmetic folds away entirely.
EXPECTED_OPS: dict[str, dict[str, int]] = {
    "taef2_encoder": {"conv": 41, "relu": 33, "layer_norm": 3, "batch_norm": 3, "reshape": 6},
    "taef2_decoder": {"conv": 41, "relu": 34, "layer_norm": 3, "upsample_nearest_neighbor": 3, "tanh": 1},
    "sd15_vae_decoder": {"conv": 36, "layer_norm": 30, "silu": 29, "softmax": 1, "upsample_nearest_neighbor": 3},
    "tiny_unet": {"conv": 47, "layer_norm": 49, "softmax": 12, "gelu": 6, "sin": 1, "cos": 1},
    "tiny_clip_text": {"layer_norm": 11, "softmax": 5, "linear": 30, "reduce_argmax": 1, "gather": 2},
    "tiny_controlnet": {"conv": 32, "layer_norm": 24, "softmax": 6, "gelu": 3},
}
# Ops that would mean a shape computation was left for run time in a static package.
SHAPE_OPS = {"shape", "fill", "floor_div", "range_1d"}


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_converts_with_the_right_io(name: str, sd_graphs: ModuleType, taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    model, feeds = fixture_model(name, sd_graphs, taef2)
    shapes = {k: v.shape for k, v in feeds.items()}
    info = export_mlpackage(model, tmp_path / f"{name}.mlpackage", input_shapes=shapes)
    size = sum(p.stat().st_size for p in (tmp_path / f"{name}.mlpackage").rglob("*") if p.is_file())
    print(f"{name}: converted in {info['convert_seconds']:.1f} s, package {size / 1e6:.2f} MB, ops {info['ops']}")
    assert info["metadata"]["sdkit.graph"]
    want_inputs = [
        (i.name, "int32" if i.dtype == np.int64 else "float32", list(shapes[i.name])) for i in model.graph.inputs
    ]
    assert [(f["name"], f["dtype"], f["shape"]) for f in info["inputs"]] == want_inputs
    expected_out = _output_shapes(name, feeds)
    assert [(f["name"], f["dtype"]) for f in info["outputs"]] == [(o.name, "float32") for o in model.graph.outputs]
    assert [tuple(f["shape"]) for f in info["outputs"]] == expected_out
    for op, count in EXPECTED_OPS[name].items():
        assert info["ops"].get(op) == count, (op, info["ops"])
    assert not SHAPE_OPS & set(info["ops"]), info["ops"]
    weights_mb = model.weights.nbytes / 1e6
    assert size / 1e6 >= 0.9 * weights_mb  # fp32 weights are in the package


def _output_shapes(name: str, feeds: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
    """Output shapes from the architecture (32x32 latents, 256 px images)."""
    if name == "taef2_encoder":
        return [(1, 32, 32, 32)]
    if name in ("taef2_decoder", "sd15_vae_decoder"):
        return [(1, 3, 256, 256)]
    if name == "tiny_unet":
        return [(1, 4, 32, 32)]
    if name == "tiny_clip_text":
        return [(1, 77, 32), (1, 32)]
    return [(1, 32, 32, 32)] * 3 + [(1, 32, 16, 16), (1, 64, 16, 16), (1, 64, 16, 16), (1, 64, 16, 16)]


def test_fp16_package_computes_in_fp16_with_fp32_io(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    from sdkit.model import load_onnx

    model = load_onnx(taef2 / "taef2_decoder.onnx")
    shapes = {"latent": (1, 32, 32, 32)}
    fp32 = export_mlpackage(model, tmp_path / "fp32.mlpackage", input_shapes=shapes)
    fp16 = export_mlpackage(model, tmp_path / "fp16.mlpackage", input_shapes=shapes, precision="fp16")
    assert [f["dtype"] for f in fp16["inputs"] + fp16["outputs"]] == ["float32", "float32"]
    assert fp16["ops"]["cast"] == 2 and "cast" not in fp32["ops"]  # in at the input, out at the output

    def weight_bytes(name: str) -> int:
        return sum(p.stat().st_size for p in (tmp_path / name).rglob("*.bin"))

    assert weight_bytes("fp16.mlpackage") < 0.6 * weight_bytes("fp32.mlpackage")


def test_ranged_shapes_keep_the_shape_ops(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    from sdkit.model import load_onnx

    model = load_onnx(taef2 / "taef2_decoder.onnx")
    info = export_mlpackage(
        model, tmp_path / "ranged.mlpackage", shape_ranges={"latent": ((1, 32, 16, 16), (1, 32, 128, 128))}
    )
    (latent,) = info["inputs"]
    assert latent["ranges"] == [(1, 1), (32, 32), (16, 128), (16, 128)]
    assert info["ops"]["conv"] == 41
    assert info["ops"]["shape"] == 3  # the decoder's own Shape nodes, now computed at run time


def test_enumerated_shapes(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    from sdkit.model import load_onnx

    model = load_onnx(taef2 / "taef2_decoder.onnx")
    shapes = [(1, 32, 32, 32), (1, 32, 64, 64), (2, 32, 32, 32)]
    info = export_mlpackage(model, tmp_path / "enum.mlpackage", enumerated_shapes={"latent": shapes})
    assert info["inputs"][0]["enumerated"] == [list(s) for s in shapes]


def test_macos15_target_fuses_attention(sd_graphs: ModuleType, taef2: Path, tmp_path: Path) -> None:
    """macOS 15 packages compute each attention with one scaled_dot_product_attention op."""
    needs_coremltools()
    model, feeds = fixture_model("tiny_clip_text", sd_graphs, taef2)
    shapes = {k: v.shape for k, v in feeds.items()}
    info = export_mlpackage(model, tmp_path / "clip.mlpackage", input_shapes=shapes, target="macOS15")
    assert info["ops"]["scaled_dot_product_attention"] == 5 and "softmax" not in info["ops"]
    assert info["spec_version"] == 9  # Core ML 8 (macOS 15)


@pytest.mark.slow
def test_macos15_target_fuses_unet_self_and_cross_attention(sd_graphs: ModuleType, taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    name = "tiny_unet"
    model, feeds = fixture_model(name, sd_graphs, taef2)
    shapes = {k: v.shape for k, v in feeds.items()}
    info = export_mlpackage(model, tmp_path / "m.mlpackage", input_shapes=shapes, target="macOS15", precision="fp16")
    expected = EXPECTED_OPS[name]["softmax"]
    assert info["ops"]["scaled_dot_product_attention"] == expected and "softmax" not in info["ops"]


def test_clip_with_ranged_batch_and_sequence(sd_graphs: ModuleType, tmp_path: Path) -> None:
    """Symbolic shapes through a transformer: the causal mask is built at run time
    (range_1d, less_equal, select) and attention still fuses for macOS 15."""
    needs_coremltools()
    from sdkit.model import Model

    model = Model.from_proto(sd_graphs.load_model("tiny_clip_text", seed=0))
    info = export_mlpackage(
        model, tmp_path / "clip.mlpackage", shape_ranges={"input_ids": ((1, 8), (2, 77))}, target="macOS15"
    )
    (ids,) = info["inputs"]
    assert (ids["dtype"], ids["ranges"]) == ("int32", [(1, 2), (8, 77)])
    assert {"range_1d", "less_equal", "select", "shape"} <= set(info["ops"])
    assert info["ops"]["scaled_dot_product_attention"] == 5 and "softmax" not in info["ops"]
