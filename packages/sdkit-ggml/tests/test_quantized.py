"""precision="q8_0": matrix weights quantized to ggml Q8_0 at compile (and on refit), checked
against onnxruntime in fp32.

Tolerance. A Q8_0 block stores 32 weights as int8 ``round(w / d)`` with ``d = max|w| / 127`` (d
kept in F16): each weight is off by at most ``d / 2`` (plus 127 d 2^-11 from the F16 scale), so
a block's error has L2 norm <= sqrt(32) * 0.56 d while the block's own norm is >= max|w| = 127
d, a relative error of at most 2.5% whatever the data. For Gaussian data the error is uniform on
[-d/2, d/2] (rms d / sqrt(12)) and max|w| of 32 samples is ~2.1 sigma, so ~0.5% rms. ggml also
quantizes the activations (mul_mat's second operand) to Q8_0 blocks for the integer dot product,
so a product sees two independent ~0.5% errors: ~0.7% rel-L2 expected. The bound used, 2e-2, is
~3x that and under the worst-case per-operand 2.5%; the floor, 1e-3 (3x fp16's ~3e-4), shows the
weights really were quantized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import sdkit
from sdkit.cli.main import main
from sdkit.errors import OptionError
from sdkit.model import Model
from sdkit.testing import one_node_model

Q8_0_BOUND = 2e-2
Q8_0_FLOOR = 1e-3
FP16_BOUND = 2e-3  # F16 weights (11-bit mantissa) and F16 im2col: ~3e-4 expected


def onnxruntime_fp32(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    proto = model.graph.to_onnx(model.weights).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm((got - want).ravel()) / np.linalg.norm(want.ravel()))


def run(model: Model, feeds: dict[str, np.ndarray], precision: str) -> tuple[np.ndarray, Any]:
    compiled = sdkit.compile(model, backend="ggml", precision=precision, threads=1)
    return compiled.run(feeds)["out0"], compiled


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(8)


def test_matmul_q8_0_vs_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 64), dtype=np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": rng.standard_normal((64, 48), dtype=np.float32)})
    want = onnxruntime_fp32(model, {"x": x})
    got, compiled = run(model, {"x": x}, "q8_0")
    assert Q8_0_FLOOR < rel_l2(got, want) <= Q8_0_BOUND
    assert compiled.info["quantized"] == {"w": (48, 64)}  # stored transposed: rows along K
    assert compiled.memory()["quantized_weights"] == 1
    assert compiled.memory()["unquantized_weights"] == 0


def test_auto_with_q8_0_picks_ggml(rng: np.random.Generator) -> None:
    """Only ggml declares q8_0: auto passes over higher-priority backends (OpenVINO, where
    installed) that would refuse it, instead of failing on their OptionError."""
    w = (rng.standard_normal((64, 32)) * 0.1).astype(np.float32)
    model = one_node_model("MatMul", {"x": np.zeros((4, 64), np.float32)}, initializers={"w": w})
    x = rng.standard_normal((4, 64)).astype(np.float32)
    choice = sdkit.choose_backend(model, precision="q8_0")
    assert choice.backend == "ggml"
    for name, why in choice.rejected:
        assert "does not offer precision 'q8_0'" in why, (name, why)
    compiled = sdkit.compile(model, precision="q8_0", threads=1)
    assert compiled.backend_name == "ggml"
    error = rel_l2(compiled.run({"x": x})["out0"], onnxruntime_fp32(model, {"x": x}))
    assert Q8_0_FLOOR < error < Q8_0_BOUND


@pytest.mark.parametrize("attributes", [{"transB": 1}, {"alpha": 0.5, "beta": 2.0}])
def test_gemm_q8_0_vs_onnxruntime(attributes: dict[str, Any], rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 96), dtype=np.float32)
    w = rng.standard_normal((32, 96) if attributes.get("transB") else (96, 32), dtype=np.float32)
    bias = rng.standard_normal(32, dtype=np.float32)
    model = one_node_model("Gemm", {"x": x}, attributes, initializers={"w": w, "c": bias})
    want = onnxruntime_fp32(model, {"x": x})
    got, compiled = run(model, {"x": x}, "q8_0")
    assert Q8_0_FLOOR < rel_l2(got, want) <= Q8_0_BOUND
    assert list(compiled.info["quantized"]) == ["w"]  # the bias is added in F32


def test_rows_that_are_not_whole_blocks_stay_f16(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 40), dtype=np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": rng.standard_normal((40, 16), dtype=np.float32)})
    got, compiled = run(model, {"x": x}, "q8_0")
    assert rel_l2(got, onnxruntime_fp32(model, {"x": x})) <= FP16_BOUND
    assert compiled.info["unquantized"] == {"w": (16, 40)}
    assert compiled.memory()["unquantized_weights"] == 1


def test_conv_kernels_stay_f16_under_q8_0(rng: np.random.Generator) -> None:
    """ggml reads a quantized operand only as mul_mat's first argument; the conv lowering puts
    im2col there, and stable-diffusion.cpp never quantizes conv kernels either (rows of KW)."""
    x = rng.standard_normal((1, 8, 12, 12), dtype=np.float32)
    w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32) * 0.1
    model = one_node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": w})
    want = onnxruntime_fp32(model, {"x": x})
    got, compiled = run(model, {"x": x}, "q8_0")
    half, _ = run(model, {"x": x}, "fp16")
    assert rel_l2(got, want) <= FP16_BOUND
    np.testing.assert_array_equal(got, half)
    assert compiled.info["quantized"] == {}


def test_q8_0_weight_bytes_are_a_3_8th_of_fp32(rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 256), dtype=np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": rng.standard_normal((256, 256), dtype=np.float32)})
    full = run(model, {"x": x}, "fp32")[1].memory()["weights"]
    quantized = run(model, {"x": x}, "q8_0")[1].memory()["weights"]
    assert full == 256 * 256 * 4
    assert full / quantized == pytest.approx(128 / 34, rel=2e-3)  # 32 fp32 weights -> 34 bytes


def test_refit_requantizes(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 64), dtype=np.float32)
    w1, w2 = rng.standard_normal((2, 64, 32), dtype=np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": w1})
    compiled = sdkit.compile(model, backend="ggml", precision="q8_0", threads=1)
    compiled.refit(model.weights.updated({"w": w2}))
    got = compiled.run({"x": x})["out0"]
    assert rel_l2(got, (x.astype(np.float64) @ w2).astype(np.float32)) <= Q8_0_BOUND
    assert compiled.info["quantized"] == {"w": (32, 64)}


def test_bad_precision_is_one_option_error() -> None:
    model = one_node_model("Relu", {"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(OptionError, match="precision"):
        sdkit.compile(model, backend="ggml", precision="q4_0")
    with pytest.raises(OptionError, match="q8_0"):
        sdkit.compile(model, backend="ggml", precision="bf16")
    with pytest.raises(OptionError, match="q8_0"):
        sdkit.compile(model, backend="reference", precision="q8_0")


def test_cli_precision_q8_0(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 64), dtype=np.float32)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": rng.standard_normal((64, 48), dtype=np.float32)})
    path, out = tmp_path / "mm.onnx", tmp_path / "out.npz"
    onnx.save(model.graph.to_onnx(model.weights), path)
    np.save(tmp_path / "x.npy", x)
    argv = ["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--backend", "ggml", "--precision", "q8_0"]
    assert main([*argv, "--threads", "1", "--no-cache", "-o", str(out)]) == 0
    got = np.load(out)["out0"]
    assert Q8_0_FLOOR < rel_l2(got, onnxruntime_fp32(model, {"x": x})) <= Q8_0_BOUND
