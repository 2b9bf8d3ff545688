"""``check``: the pre-flight that runs without TensorRT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sdkit.families import shipped
from sdkit.model import load_onnx
from sdkit.testing import one_node_model
from sdkit_trt.backend import TensorRTBackend


def test_taef2_passes(taef2: Path) -> None:
    assert TensorRTBackend().check(load_onnx(taef2 / "taef2_decoder.onnx").graph).ok


def test_unsupported_ops_domains_and_types_are_all_listed() -> None:
    backend = TensorRTBackend()
    unique = backend.check(one_node_model("Unique", {"x": np.zeros(4, np.float32)}, outputs=1).graph)
    assert [u.op_type for u in unique.unsupported] == ["Unique"]
    double = backend.check(one_node_model("Relu", {"x": np.zeros(4, np.float64)}).graph)
    assert any("float64" in u.reason for u in double.unsupported)
    relu = backend.check(one_node_model("Relu", {"x": np.zeros(4, np.float32)}).graph)
    assert relu.ok


@pytest.mark.parametrize("name", shipped.names())
def test_shipped_full_size_graphs_are_supported(name: str) -> None:
    """sdkit's weightless full-size graphs (Flux / Chroma / SD3 transformers, T5-XXL, the VAEs,
    CLIP, the UNets): every node passes the pre-flight (no custom domain, no op TensorRT's parser lacks)."""
    report = TensorRTBackend().check(shipped.load_graph(name))
    assert report.ok, report.summary()
