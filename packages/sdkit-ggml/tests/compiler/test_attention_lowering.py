"""Attention to ``ggml_flash_attn_ext`` (``compiler/pass_attention.py``, ``converters/fused.py``)
against onnxruntime: with and without an additive mask, SD's and Flux's head sizes, batch 2,
sequence lengths that fill no kernel tile, torch SDPA's scaled operands, and the device
fallback (mul_mat, soft_max_ext, mul_mat) where ``supports_op`` refuses the fused op.

Tolerances (relative L2 vs onnxruntime fp32): 1e-5 at ``precision="fp32"`` (F32 Q, K, V; the
mask rounded to F16 is exact for 0 / -inf / large negative values); 2e-3 at ``"fp16"`` (F16 K
and V, and on the CPU an F16 accumulator of softmax(QK^T) V: measured 3e-4 at 4096 keys).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.errors import OptionError
from sdkit.model import Model
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.compiler.passes import apply_passes
from sdkit_ggml.runtime import lib as L

ort = pytest.importorskip("onnxruntime")
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3}
NEG = float(np.finfo(np.float32).min)  # what torch's CLIP puts in its causal mask


def attention_model(
    shape: tuple[int, int, int, int, int],
    mask: tuple[int, ...] | None = None,
    *,
    sdpa: bool = False,
    constant_mask: bool = True,
    rank: int = 4,
) -> tuple[Model, dict[str, np.ndarray]]:
    """``softmax(Q K^T * d^-0.5 [+ m]) V`` as torch exports it; ``sdpa``: Q and K^T each scaled
    by a rank-0 ``sqrt(d^-0.5)`` computed from Q's shape (torch's scaled_dot_product_attention).
    The mask is a Constant node (as CLIP's causal mask folds to) or a graph input. ``rank`` 3:
    [B*H, L, d] operands (B must be 1) and a mask without its batch dim."""
    b, h, lq, lk, d = shape
    dims = {"q": (b, h, lq, d), "k": (b, h, lk, d), "v": (b, h, lk, d)}
    if rank == 3:
        dims = {n: s[1:] for n, s in dims.items()}
        mask = None if mask is None else mask[1:]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[*range(rank - 2), rank - 1, rank - 2])]
    if sdpa:
        nodes += [
            helper.make_node("Shape", ["q"], ["q_shape"]),
            helper.make_node("Constant", [], ["last"], value=helper.make_tensor("last", TensorProto.INT64, [], [-1])),
            helper.make_node("Gather", ["q_shape", "last"], ["d_int"], axis=0),
            helper.make_node("Cast", ["d_int"], ["d"], to=TensorProto.FLOAT),
            helper.make_node("Sqrt", ["d"], ["sqrt_d"]),
            helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])),
            helper.make_node("Div", ["one", "sqrt_d"], ["scale"]),
            helper.make_node("Sqrt", ["scale"], ["root"]),
            helper.make_node("Mul", ["q", "root"], ["qs"]),
            helper.make_node("Mul", ["kt", "root"], ["kts"]),
            helper.make_node("MatMul", ["qs", "kts"], ["scores"]),
        ]
    else:
        factor = helper.make_tensor("factor", TensorProto.FLOAT, [], [d**-0.5])
        nodes += [
            helper.make_node("MatMul", ["q", "kt"], ["raw"]),
            helper.make_node("Constant", [], ["factor"], value=factor),
            helper.make_node("Mul", ["raw", "factor"], ["scores"]),
        ]
    logits = "scores"
    rng = np.random.default_rng(sum(shape))
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in dims.items()}
    if mask is not None:
        values = _mask_values(mask, rng)
        if constant_mask:
            tensor = helper.make_tensor("m", TensorProto.FLOAT, list(mask), values.ravel().tolist())
            nodes.append(helper.make_node("Constant", [], ["m"], value=tensor))
        else:
            dims["m"] = mask
            feeds["m"] = values
        nodes.append(helper.make_node("Add", ["scores", "m"], ["masked"]))
        logits = "masked"
    nodes += [helper.make_node("Softmax", [logits], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["out"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in dims.items()]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "attention", inputs, outputs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return Model.from_proto(proto), feeds


def _mask_values(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Causal (finfo.min above the diagonal) for a [.., Lq, Lk] mask, key padding (-inf on the
    last keys) for [.., 1, Lk], a random bias otherwise (per head)."""
    lq, lk = shape[-2], shape[-1]
    if lq > 1 and shape[-3] == 1:
        causal = np.triu(np.full((lq, lk), NEG, np.float32), 1)
        return np.broadcast_to(causal, shape).copy()
    if lq == 1:
        padding = np.zeros(shape, np.float32)
        padding[..., lk - 3 :] = -np.inf
        return padding
    return rng.standard_normal(shape).astype(np.float32)


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _reference(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    return np.asarray(session.run(None, feeds)[0])


def _run(model: Model, feeds: dict[str, np.ndarray], precision: str, **options: str) -> np.ndarray:
    options.setdefault("f16_activations", "on")  # F16 K and V at fp16 (the CPU's default is off)
    compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=1, precision=precision, **options)
    return np.asarray(compiled.run(feeds)["out"])


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The ggml ops ``ggml_backend_supports_op`` was asked about (answered as the CPU does)."""
    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    seen: Counter[str] = Counter()

    def supports(backend: int, node: int) -> bool:
        seen[(lib.ggml_op_desc(node) or b"").decode()] += 1
        return bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    return seen


@pytest.fixture
def no_flash(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The CPU backend refusing FLASH_ATTN_EXT (as ggml-cuda does for head sizes it has no
    kernel for); counts the refusals."""
    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]
    refused: Counter[str] = Counter()

    def supports(backend: int, node: int) -> bool:
        if (lib.ggml_op_desc(node) or b"") == b"FLASH_ATTN_EXT":
            refused["FLASH_ATTN_EXT"] += 1
            return False
        return bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", supports)
    return refused


def _fused(model: Model, patterns: str) -> list[Any]:
    nodes = apply_passes(model.graph.proto, attention=patterns).graph.node
    return [n for n in nodes if n.domain == FUSED_DOMAIN and n.op_type == "Attention"]


MASKS = {
    "none": None,
    "causal": lambda b, h, lq, lk: (b, 1, lq, lk),
    "padding": lambda b, h, lq, lk: (b, 1, 1, lk),
    "per-head bias": lambda b, h, lq, lk: (1, h, lq, lk),
}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("head", [40, 64, 80, 128])
def test_flash_attention_matches_onnxruntime(head: int, mask: str, precision: str, asked: Counter[str]) -> None:
    b, h, lq, lk = 2, 3, 33, 19  # batch 2; lengths that are no multiple of any kernel tile
    make = MASKS[mask]
    model, feeds = attention_model((b, h, lq, lk, head), None if make is None else make(b, h, lq, lk))
    assert len(_fused(model, "all")) == 1
    got = _run(model, feeds, precision, flash_attn="on")
    if precision == "fp32" and mask == "per-head bias":
        # a bias F16 cannot hold: at fp32 the explicit path, with the F32 mask
        assert asked["FLASH_ATTN_EXT"] == 0 and asked["SOFT_MAX"] == 1, asked
    else:  # lowered to the fused op, which the CPU computes: no score matrix in the graph
        assert asked["FLASH_ATTN_EXT"] >= 1 and asked["SOFT_MAX"] == asked["MUL_MAT"] == 0, asked
    assert _rel_l2(got, _reference(model, feeds)) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_runtime_mask(precision: str, asked: Counter[str]) -> None:
    """A mask fed at run time: flash attention at fp16 (F16 mask); at fp32, whose mask values
    are unknown at compile time, the explicit path with the F32 mask."""
    model, feeds = attention_model((2, 2, 13, 13, 64), (2, 1, 13, 13), constant_mask=False)
    got = _run(model, feeds, precision, flash_attn="on")
    assert (asked["FLASH_ATTN_EXT"] > 0) == (precision == "fp16"), asked
    assert _rel_l2(got, _reference(model, feeds)) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("mask", ["none", "causal", "per-head bias"])
def test_fallback_where_the_device_has_no_kernel(mask: str, precision: str, no_flash: Counter[str]) -> None:
    make = MASKS[mask]
    b, h, lq, lk, d = 2, 2, 21, 21, 160  # SD 1.5's 160-wide heads: no CUDA kernel
    model, feeds = attention_model((b, h, lq, lk, d), None if make is None else make(b, h, lq, lk))
    got = _run(model, feeds, precision, flash_attn="on")
    if not (precision == "fp32" and mask == "per-head bias"):  # that one never asks (explicit)
        assert no_flash["FLASH_ATTN_EXT"] >= 1  # asked, refused, lowered the other way: no abort
    assert _rel_l2(got, _reference(model, feeds)) <= TOLERANCE[precision]


def test_sdpa_scaled_operands_fused() -> None:
    model, feeds = attention_model((2, 2, 17, 17, 64), (2, 1, 17, 17), sdpa=True)
    (fused,) = _fused(model, "all")
    assert list(fused.input)[3:] == ["m", "root", "root"]  # mask, Q's and K^T's scalar
    assert _fused(model, "plain") == []
    for precision in ("fp32", "fp16"):
        got = _run(model, feeds, precision, flash_attn="on")
        assert _rel_l2(got, _reference(model, feeds)) <= TOLERANCE[precision]


def test_rank3_attention_with_a_broadcast_mask() -> None:
    """CLIP's layout before diffusers' SDPA: [B*H, L, d] with a causal mask [1, L, L]."""
    model, feeds = attention_model((1, 4, 77, 77, 64), (1, 1, 77, 77), rank=3)
    assert [len(n.input) for n in _fused(model, "all")] == [4]
    for precision in ("fp32", "fp16"):
        got = _run(model, feeds, precision, flash_attn="on")
        assert _rel_l2(got, _reference(model, feeds)) <= TOLERANCE[precision]


def test_fp32_default_leaves_masked_attention_as_exported() -> None:
    """``flash_attn="auto"`` at fp32 fuses only what it fused before (fp32 results unchanged):
    the masked pattern runs as exported, bit for bit what ``"off"`` gives."""
    model, feeds = attention_model((2, 2, 9, 9, 40), (2, 1, 9, 9))
    assert _fused(model, "plain") == []
    assert len(_fused(model, "all")) == 1
    np.testing.assert_array_equal(_run(model, feeds, "fp32"), _run(model, feeds, "fp32", flash_attn="off"))
    plain, _ = attention_model((2, 2, 9, 9, 40))
    assert len(_fused(plain, "plain")) == 1  # the unmasked pattern: flash attention as before


def test_bad_switch_values_are_option_errors() -> None:
    model, _ = attention_model((1, 1, 4, 4, 8))
    with pytest.raises(OptionError, match="flash_attn"):
        sdkit.compile(model, backend="ggml", device="cpu", flash_attn="maybe")
    with pytest.raises(OptionError, match="f16_activations"):
        sdkit.compile(model, backend="ggml", device="cpu", f16_activations="yes")


def test_patterns_per_switch(asked: Counter[str]) -> None:
    """``flash_attn="off"`` leaves every pattern as exported (no FLASH_ATTN_EXT node, at fp16
    too); a mask that would widen the scores (rank 5 over rank-4 operands) is never fused."""
    model, feeds = attention_model((1, 2, 5, 5, 8), (1, 2, 5, 5))
    _run(model, feeds, "fp16", flash_attn="off")
    assert asked["FLASH_ATTN_EXT"] == 0 and asked["SOFT_MAX"] == 1
    proto = model.graph.proto
    mask = next(n for n in proto.graph.node if n.output[0] == "m")
    wide = helper.make_tensor("m", TensorProto.FLOAT, [3, 1, 2, 5, 5], np.zeros(150, np.float32).tolist())
    mask.attribute[0].t.CopyFrom(wide)
    assert _fused(Model.from_proto(proto), "all") == []


def _gpu() -> str:
    from sdkit_ggml.backend import GgmlBackend

    found = [d for d in GgmlBackend().devices() if d.kind != "cpu"]
    if not found:
        pytest.skip("ggml lists no GPU device (build ggml with GGML_CUDA=ON and set SDKIT_GGML_LIB_DIR)")
    return str(found[0])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("head", [40, 64, 80, 128, 160])
def test_flash_attention_on_the_gpu(head: int, precision: str) -> None:
    """On ggml-cuda (not yet run: no GPU was at hand when this was written): heads with a
    kernel take flash attention, 160 the explicit path; CUDA's kernels compute in F16 whatever
    K/V's type, so the fp16 bound holds at fp32 too; F16 products (TF32 elsewhere) at 5e-3."""
    device = _gpu()
    model, feeds = attention_model((2, 3, 33, 19, head), (2, 1, 33, 19))
    compiled = sdkit.compile(model, backend="ggml", device=device, precision=precision, flash_attn="on")
    assert _rel_l2(np.asarray(compiled.run(feeds)["out"]), _reference(model, feeds)) <= 5e-3
