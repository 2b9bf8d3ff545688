"""SD-architecture graphs (seeded random weights, fixtures/) vs onnxruntime in fp32."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import sdkit
from sdkit.model import Model

ort = pytest.importorskip("onnxruntime")


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _check(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    model = Model.from_proto(proto)
    got = sdkit.compile(model, backend="ggml").run(feeds)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for info, ref in zip(model.outputs, want, strict=True):
        assert _rel_l2(got[info.name], ref) <= 1e-4, info.name


def test_tiny_unet(sd_graphs: Any) -> None:
    _check(sd_graphs.load_model("tiny_unet"), sd_graphs.example_inputs("tiny_unet"))


def test_tiny_clip_text(sd_graphs: Any) -> None:
    # pooler_output gathers at argmax(input_ids) + row offsets: integer index arithmetic whose
    # range is proven at compile time
    _check(sd_graphs.load_model("tiny_clip_text"), sd_graphs.example_inputs("tiny_clip_text"))


def test_tiny_controlnet(sd_graphs: Any) -> None:
    _check(sd_graphs.load_model("tiny_controlnet"), sd_graphs.example_inputs("tiny_controlnet"))


@pytest.mark.slow
def test_sd15_vae_encoder(sd_graphs: Any) -> None:
    _check(sd_graphs.load_model("sd15_vae_encoder"), sd_graphs.example_inputs("sd15_vae_encoder"))


@pytest.mark.slow
def test_sd15_vae_decoder(sd_graphs: Any) -> None:
    _check(sd_graphs.load_model("sd15_vae_decoder"), sd_graphs.example_inputs("sd15_vae_decoder"))


FLUX_SIZES = {"dynamic": None, "1024px": {"batch": 1, "image_tokens": 4096, "text_tokens": 512}}


@pytest.mark.parametrize("size", list(FLUX_SIZES))
@pytest.mark.parametrize("name", ["flux_dev_transformer", "flux_schnell_transformer"])
def test_shipped_flux_transformer_passes_check(name: str, size: str) -> None:
    """FLUX.1's transformer as shipped (``sdkit/families/graphs``: 19 double + 38 single blocks,
    11.9B weights, dynamic batch / image / text tokens; weightless: check() reads no weights) has
    no node ggml cannot compile: as shipped (shape-dependent limits left to compile, said in a
    note), and with the dims of a 1024 px image and 512 T5 tokens set (every node decided)."""
    from sdkit.families import shipped
    from sdkit.model import Graph
    from sdkit.selection import get_backend

    proto = onnx.ModelProto()
    proto.CopyFrom(shipped.load_graph(name).proto)
    sizes = FLUX_SIZES[size]
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if sizes is not None and dim.dim_param:
                dim.dim_value = sizes[dim.dim_param]
    report = get_backend("ggml").check(Graph(proto))
    assert report.ok, report.unsupported
    assert bool(report.notes) == (sizes is None), report.notes
