"""The fp16 compute path (``precision="fp16"``, ``compiler/lowering_modes.py``) against
onnxruntime fp32: F16 weights (as before), F16 operands into the products of two activations
and flash attention's K and V, and every attention pattern (masked, SDPA) to flash attention.

Stated tolerances (relative L2 per output vs onnxruntime fp32; measured values in the
sdkit-ggml README): 3e-3 for the tiny SD graphs (measured 5e-4 to 1e-3, as with F16 weights
alone: the weights' rounding dominates), 5e-3 for the SD 1.5 VAE and TAEF2 (slow). fp32 is
untouched by ``f16_activations``: bit for bit the same either way.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.model import Model, load_onnx
from sdkit_ggml.compiler.passes import apply_passes
from sdkit_ggml.runtime import lib as L

ort = pytest.importorskip("onnxruntime")
SD_TOLERANCE = 3e-3
VAE_TOLERANCE = 5e-3


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The ggml ops of the built graphs (``ggml_backend_supports_op`` is asked about each)."""
    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    seen: Counter[str] = Counter()

    def supports(backend: int, node: int) -> bool:
        seen[(lib.ggml_op_desc(node) or b"").decode()] += 1
        return bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    return seen


def activation_product() -> tuple[Model, dict[str, np.ndarray]]:
    """``x @ y`` and ``einsum(x, y)`` of two runtime tensors, plus ``x @ w`` with a weight."""
    rng = np.random.default_rng(5)
    w = helper.make_tensor("w", TensorProto.FLOAT, [48, 24], rng.standard_normal(48 * 24).tolist())
    nodes = [
        helper.make_node("MatMul", ["x", "y"], ["xy"]),
        helper.make_node("Einsum", ["x", "y"], ["e"], equation="bij,bjk->bik"),
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 31, 48]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48, 37]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("xy", "e", "xw")]
    graph = helper.make_graph(nodes, "products", inputs, outputs, [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((2, 31, 48)).astype(np.float32)}
    feeds["y"] = rng.standard_normal((2, 48, 37)).astype(np.float32)
    return Model.from_proto(proto), feeds


@pytest.mark.parametrize("mode", ["on", "off"])
def test_activation_products(mode: str, asked: Counter[str]) -> None:
    model, feeds = activation_product()
    want = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, feeds)
    compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=1, precision="fp16", f16_activations=mode)
    got = compiled.run(feeds)
    assert compiled.info["f16_activations"] is (mode == "on")
    # on: the runtime operand of each activation product cast to F16 (ggml_cast is a CPY node)
    assert asked["CPY"] == (2 if mode == "on" else 0), asked
    for name, ref in zip(("xy", "e", "xw"), want, strict=True):
        assert _rel_l2(got[name], ref) <= 1e-3, name  # F16 rounding of the operands: ~3e-4


def test_f16_activations_default_off_on_the_cpu() -> None:
    from sdkit_ggml.compiler.lowering_modes import f16_activations

    model, _ = activation_product()
    compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=1, precision="fp16")
    assert compiled.info["f16_activations"] is False  # "auto": on for a GPU device only
    assert f16_activations("auto", "fp16", "cuda") and not f16_activations("auto", "fp32", "cuda")


def test_fp32_untouched_by_the_switch(sd_graphs: Any) -> None:
    proto = sd_graphs.load_model("tiny_unet")
    feeds = sd_graphs.example_inputs("tiny_unet")
    runs = []
    for mode in ("on", "off"):
        compiled = sdkit.compile(Model.from_proto(proto), backend="ggml", device="cpu", threads=1, f16_activations=mode)
        assert compiled.info["f16_activations"] is False and compiled.info["flash_attn"] == "auto"
        runs.append(compiled.run(feeds))
    for name, value in runs[0].items():
        np.testing.assert_array_equal(value, runs[1][name])


def _check_fp16(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tolerance: float, **options: str) -> None:
    """At fp16 with the F16 activation path on (on a CPU its default is off) unless ``options`` say otherwise."""
    options.setdefault("f16_activations", "on")
    model = Model.from_proto(proto)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = sdkit.compile(model, backend="ggml", device="cpu", precision="fp16", **options).run(feeds)
    for info, ref in zip(model.outputs, want, strict=True):
        if ref.dtype.kind == "f":
            assert _rel_l2(got[info.name], ref) <= tolerance, info.name


def test_tiny_clip_text_fp16(sd_graphs: Any) -> None:
    proto = sd_graphs.load_model("tiny_clip_text")
    fused = [n for n in apply_passes(proto, attention="all").graph.node if n.op_type == "Attention"]
    assert len(fused) == 5 and all(len(n.input) == 4 for n in fused)  # the causal mask taken in
    _check_fp16(proto, sd_graphs.example_inputs("tiny_clip_text"), SD_TOLERANCE)


@pytest.mark.parametrize("batch", [1, 2])
def test_tiny_unet_fp16(sd_graphs: Any, batch: int) -> None:
    feeds = sd_graphs.example_inputs("tiny_unet")
    if batch == 2:  # classifier-free guidance's batch
        feeds = {k: np.concatenate([v, v * 0.5]) if v.ndim else v for k, v in feeds.items()}
    _check_fp16(sd_graphs.load_model("tiny_unet"), feeds, SD_TOLERANCE)


@pytest.mark.parametrize("options", [{}, {"flash_attn": "off", "f16_activations": "off"}])
def test_tiny_controlnet_fp16(sd_graphs: Any, options: dict[str, str]) -> None:
    _check_fp16(
        sd_graphs.load_model("tiny_controlnet"), sd_graphs.example_inputs("tiny_controlnet"), SD_TOLERANCE, **options
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd15_vae_decoder", "sd15_vae_encoder"])
def test_sd15_vae_fp16(sd_graphs: Any, name: str) -> None:
    _check_fp16(sd_graphs.load_model(name), sd_graphs.example_inputs(name), VAE_TOLERANCE)


@pytest.mark.slow
def test_taef2_decoder_fp16(taef2: Path) -> None:
    path = taef2 / "taef2_decoder.onnx"
    latent = {"latent": np.random.default_rng(0).standard_normal((1, 32, 32, 32)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, latent)[0]
    compiled = sdkit.compile(load_onnx(path), backend="ggml", device="cpu", precision="fp16", f16_activations="on")
    got = next(iter(compiled.run(latent).values()))
    assert _rel_l2(got, want) <= VAE_TOLERANCE


def test_matmul_prec_f32_is_set_on_every_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """``matmul_prec="f32"`` marks each mul_mat GGML_PREC_F32 (op_params[0] = 10, what
    ggml_mul_mat_set_prec writes; ggml-cuda then computes F16 operands in F32). The CPU
    accumulates in F32 anyway: the same bits either way there."""
    from sdkit_ggml.runtime.profile import TensorNode

    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    precs: list[int] = []

    def supports(backend: int, node: int) -> bool:
        if (lib.ggml_op_desc(node) or b"") == b"MUL_MAT":
            precs.append(int(TensorNode.from_address(node).op_params[0]))
        return bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    model, feeds = activation_product()
    runs = {}
    for mode in ("default", "f32"):
        precs.clear()
        compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=1, precision="fp16", matmul_prec=mode)
        runs[mode] = compiled.run(feeds)
        assert compiled.info["matmul_prec"] == mode
        assert precs and set(precs) == {L.GGML_PREC_F32 if mode == "f32" else 0}
    for name, value in runs["default"].items():
        np.testing.assert_array_equal(value, runs["f32"][name])
