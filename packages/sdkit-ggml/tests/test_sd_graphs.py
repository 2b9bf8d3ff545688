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


def test_flux_full_depth_graph_passes_check(sd_graphs: Any) -> None:
    """FLUX.1-dev's transformer as shipped (19 double + 38 single blocks, 11.9B weights; weightless:
    check() reads no weights) has no node ggml cannot compile."""
    from sdkit.model import Graph
    from sdkit.selection import get_backend

    graph = Graph(sd_graphs.flux_full_graph())
    report = get_backend("ggml").check(graph)
    assert report.ok, report.unsupported
