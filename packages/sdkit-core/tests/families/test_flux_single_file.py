"""FLUX.1 single files in BFL's layout (``sdkit.families.flux``, ``flux_keys``) on a tiny graph.

Oracle: diffusers' ``FluxTransformer2DModel.from_single_file`` on the same files (its own BFL
converter; ``fixtures/families/make_flux_single_file.py``, goldens in
``fixtures/families/tiny/flux/golden.npz``): the transformer's output on fixed inputs, and the
image ``FluxPipeline`` makes with that transformer and tiny_flow's other components (tiny_flow's
``flux_dev`` / ``flux_schnell`` case). Required: the image within 1e-3 on [0, 1] pixels on the
reference, ggml (threads=1) and openvino backends; the transformer output within 1e-4.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.families import Checkpoint, Family, MappedCheckpoint, detect
from sdkit.families.flux import FLUX_DEV, FLUX_SCHNELL, FluxArch, flux_family
from sdkit.model import Model
from sdkit.pipelines.sources import GraphWithWeights

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "fixtures" / "families" / "tiny" / "flux"
TINY_FLOW = REPO / "fixtures" / "tiny_flow"
ARCH = FluxArch(hidden=32, in_channels=64, context_dim=16, pooled_dim=32, double_blocks=1, single_blocks=1)
DEV = flux_family("tiny_flux_dev", "tiny FLUX.1 dev", TINY / "flux_dev_transformer.onnx", ARCH, guidance=True)
SCHNELL = flux_family(
    "tiny_flux_schnell", "tiny FLUX.1 schnell", TINY / "flux_schnell_transformer.onnx", ARCH, guidance=False
)
FAMILIES = [DEV, SCHNELL]
FILES = ("flux_dev_fp16", "flux_dev_bf16_comfy", "flux_schnell_bf16", "flux_dev_fp8_comfy")
IMAGE_TOLERANCE = 1e-3
OUTPUT_TOLERANCE = 1e-4


@lru_cache(maxsize=1)
def info() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TINY / "golden.json").read_text(encoding="utf-8"))
    return data


def golden(key: str) -> np.ndarray:
    with np.load(TINY / "golden.npz") as data:
        value: np.ndarray = data[key]
    return value


def mapped(file: str) -> MappedCheckpoint:
    checkpoint = Checkpoint.open(TINY / f"{file}.safetensors")
    found = detect(checkpoint, FAMILIES)
    return found.family.map(checkpoint, found.layout)


def available(backend: str) -> None:
    found = next((b for b in sdkit.backends() if b.name == backend), None)
    if found is None or not found.available:
        pytest.skip(f"backend {backend} unavailable: {found.reason if found else 'not installed'}")


@pytest.mark.parametrize("file", FILES)
def test_detected_as_dev_or_schnell_and_every_weight_mapped(file: str) -> None:
    """dev by its guidance embedder, schnell without; every initializer of the graph found, every
    tensor of the file read (no unknown keys), with or without ComfyUI's prefix."""
    checkpoint = Checkpoint.open(TINY / f"{file}.safetensors")
    found = detect(checkpoint, FAMILIES)
    assert found.family is (DEV if "dev" in file else SCHNELL)
    assert found.layout == "bfl" and found.prediction_type == "flow"
    result = found.family.map(checkpoint, found.layout)
    graph = found.family.components["transformer"].load_graph()
    assert set(result.weights["transformer"]) == {t.name for t in graph.proto.graph.initializer}
    assert result.unknown == ()
    assert len(checkpoint) == info()["files"][file]["tensors"]


@pytest.mark.parametrize("file", FILES)
def test_transformer_output_is_diffusers_from_single_file(file: str) -> None:
    """The mapped graph's output equals diffusers' ``from_single_file`` model's (reference backend):
    the fused q/k/v and linear1 slices, the swapped final modulation, fp16/bf16/fp8 upcasts."""
    model = Model(DEV.components["transformer"].load_graph() if "dev" in file else _schnell_graph(), _weights(file))
    feeds = {k.rpartition("/")[2]: golden(k) for k in _input_keys(file)}
    compiled = sdkit.compile(model, backend="reference")
    out = compiled.run(feeds)["out_hidden_states"]
    diff = float(np.abs(out - golden(f"{file}/output")).max())
    print(f"{file}: transformer max |diff| {diff:.3g}")
    assert diff <= OUTPUT_TOLERANCE


def _schnell_graph() -> Any:
    return SCHNELL.components["transformer"].load_graph()


def _weights(file: str) -> Any:
    return mapped(file).weights["transformer"]


def _input_keys(file: str) -> list[str]:
    with np.load(TINY / "golden.npz") as data:
        return [k for k in data.files if k.startswith(f"{file}/inputs/")]


IMAGE_CASES = [
    *[pytest.param("reference", f, id=f"reference-{f}") for f in ("flux_dev_fp16", "flux_dev_bf16_comfy", "flux_schnell_bf16")],
    *[pytest.param(b, "flux_dev_bf16_comfy", id=f"{b}-flux_dev_bf16_comfy") for b in ("ggml", "openvino")],
    *[pytest.param(b, "flux_schnell_bf16", id=f"{b}-flux_schnell_bf16") for b in ("ggml", "openvino")],
]


@pytest.mark.parametrize(("backend", "file"), IMAGE_CASES)
def test_image_equals_diffusers_with_the_single_file_transformer(backend: str, file: str) -> None:
    """tiny_flow's Flux pipeline with its transformer taken from the BFL file (graph + mapped
    weights) makes diffusers' image with ``from_single_file``'s transformer."""
    available(backend)
    record = info()["files"][file]
    case = record["case"]
    pipe = sdkit.load_pipeline(TINY_FLOW / record["model"], backend=backend, threads=1)
    try:
        result = mapped(file)
        source = GraphWithWeights(result.family.components["transformer"].load_graph, result.weights["transformer"])
        pipe.components["transformer"].set_source(source)
        image = pipe.generate(
            "a photo of an astronaut riding a horse on the moon",
            seed=case["seed"],
            steps=case["steps"],
            guidance_scale=case["guidance_scale"],
            width=case["width"],
            height=case["height"],
            max_sequence_length=case["max_sequence_length"],
            output_type="np",
        )
    finally:
        pipe.close()
    diff = float(np.abs(image - golden(f"{file}/image")).max())
    print(f"{file} on {backend}: image max |diff| {diff:.3g}")
    assert diff <= IMAGE_TOLERANCE


def test_a_renamed_or_missing_key_is_named(tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(TINY / "flux_dev_fp16.safetensors")
    tensors = {k: checkpoint.files[0].read(checkpoint.entry(k)) for k in checkpoint}
    tensors["double_blocks.0.img_attn.qkv_renamed.weight"] = tensors.pop("double_blocks.0.img_attn.qkv.weight")
    path = tmp_path / "renamed.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelFormatError) as err:
        DEV.map(Checkpoint.open(path), "bfl")
    assert "double_blocks.0.img_attn.qkv.weight (missing)" in str(err.value)
    assert "qkv_renamed" in str(err.value)


def test_fp8_e4m3_bytes_upcast_exactly() -> None:
    """Every float8_e4m3fn byte against its definition (bias 7, subnormals, NaN, no infinity)."""
    from sdkit.families.safetensors_reader import FP8_VALUES

    table = FP8_VALUES["F8_E4M3"]
    assert table[0x38] == 1.0 and table[0x40] == 2.0 and table[0xB8] == -1.0
    assert table[0x7E] == 448.0 and table[0x01] == 2.0**-9 and table[0x08] == 2.0**-6
    assert np.isnan(table[0x7F]) and np.isnan(table[0xFF]) and np.isfinite(table[:0x7F]).all()
    e5m2 = FP8_VALUES["F8_E5M2"]
    assert e5m2[0x3C] == 1.0 and np.isinf(e5m2[0x7C])


def test_builtin_flux_families_are_registered_and_detect_full_size_headers(tmp_path: Path) -> None:
    """The full-size families: dev (guidance_in) and schnell told apart from a header alone."""
    names = [f.name for f in sdkit.pipelines.families.registered_families()]
    assert "flux_dev" in names and "flux_schnell" in names
    assert FLUX_DEV.priority > FLUX_SCHNELL.priority
    family: Family = FLUX_DEV
    assert family.components["transformer"].probes["x_embedder.weight"] == (3072, 64)
