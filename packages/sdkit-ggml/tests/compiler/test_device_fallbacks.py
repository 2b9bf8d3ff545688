"""Lowerings that take another way where the device lacks an op (``Builder.supported``).

ggml's CUDA backend (0.20) has no 1-D pool, runs im2col on contiguous operands only and has
flash-attention kernels for some head sizes only (not SD 1.5's 160 or the VAE's 512), as its
``supports_op`` says. Here the CPU backend is made to answer like that, and the graphs that
meet each gap must still match onnxruntime / onnx.reference, with no refused node left.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.model import Model, load_onnx
from sdkit.testing import compare_with_reference, one_node_model
from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.profile import TensorNode

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def cuda_like(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> list[str]:
    """The CPU backend answering ``ggml_backend_supports_op`` as ggml-cuda 0.20 does for the
    ops above (and for the op names an indirect parametrization adds); returns the op names it
    was asked about and refused."""
    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    contiguous = next(h.ggml_is_contiguous for h in lib.handles if hasattr(h, "ggml_is_contiguous"))
    contiguous.restype, contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]
    refused: list[str] = []
    refuse_also: list[str] = getattr(request, "param", [])

    def supports(backend: int, node: int) -> bool:
        op = (lib.ggml_op_desc(node) or b"").decode()
        if op in ("POOL_1D", "FLASH_ATTN_EXT", *refuse_also):
            ok = False
        elif op == "IM2COL":
            src = TensorNode.from_address(node).src
            ok = bool(contiguous(src[0]) and contiguous(src[1]))
        else:
            ok = True
        if not ok:
            refused.append(op)
        return ok and bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    return refused


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def test_attention_without_flash_attention(cuda_like: list[str], sd_graphs: Any) -> None:
    proto = sd_graphs.load_model("tiny_unet")
    feeds = sd_graphs.example_inputs("tiny_unet")
    model = Model.from_proto(proto)
    got = sdkit.compile(model, backend="ggml", device="cpu").run(feeds)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert "FLASH_ATTN_EXT" in cuda_like  # asked, refused, lowered the other way
    for info, ref in zip(model.outputs, want, strict=True):
        assert _rel_l2(got[info.name], ref) <= 1e-5, info.name


def test_im2col_chunks_copied_contiguous(cuda_like: list[str], taef2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_GGML_IM2COL_CHUNK_MB", "1")  # every big conv in chunks (row views)
    path = taef2 / "taef2_decoder.onnx"
    latent = {"latent": np.random.default_rng(0).standard_normal((1, 32, 24, 24)).astype(np.float32)}
    got = next(iter(sdkit.compile(load_onnx(path), backend="ggml", device="cpu").run(latent).values()))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, latent)
    assert "IM2COL" in cuda_like
    assert float(np.max(np.abs(got - want[0]))) <= 1e-4


@pytest.mark.parametrize(("op", "attributes"), [("MaxPool", {"kernel_shape": [3], "strides": [2]}),
                                                ("AveragePool", {"kernel_shape": [2], "strides": [1]}),
                                                ("ReduceMax", {"axes": [1], "keepdims": 0})])  # fmt: skip
def test_pools_as_2d_pools(cuda_like: list[str], op: str, attributes: dict[str, Any]) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 11)).astype(np.float32)
    if op == "ReduceMax":  # opset 17: axes an attribute
        x = x.reshape(6, 11)
    model = one_node_model(op, {"x": x}, attributes)
    got = sdkit.compile(model, backend="ggml", device="cpu").run({"x": x})
    assert max(compare_with_reference(got, model, {"x": x}).values()) <= 1e-6
    assert "POOL_1D" in cuda_like


@pytest.mark.parametrize("groups", [96, 16])  # above and below MAX_GROUPS
@pytest.mark.parametrize("cuda_like", [[], ["CONV_2D_DW"]], indirect=True)
def test_depthwise_conv_without_its_kernel(cuda_like: list[str], groups: int) -> None:
    # one kernel per channel: GGML_OP_CONV_2D_DW where the device has it, else the
    # batched im2col + mul_mat; both against onnxruntime
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, groups, 9, 8)).astype(np.float32)
    w = rng.standard_normal((groups, 1, 3, 3)).astype(np.float32)
    model = one_node_model("Conv", {"x": x}, {"group": groups, "pads": [1, 1, 1, 1]}, initializers={"w": w})
    compiled = sdkit.compile(model, backend="ggml", device="cpu")
    got = compiled.run({"x": x})
    want = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, {"x": x})
    assert float(np.max(np.abs(next(iter(got.values())) - want[0]))) <= 1e-5
    assert ("CONV_2D_DW" in cuda_like) == bool(cuda_like)  # asked and refused only when refusing it
