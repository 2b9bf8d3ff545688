"""MatMul, Gemm and two-operand Einsum as ggml_mul_mat.

ggml_mul_mat(a, b) computes b·aᵀ and broadcasts ``a`` over ``b``'s batch dims, so an ONNX
A @ B becomes mul_mat(Bᵀ, A). A constant B is transposed once at compile time (and again on
refit); with precision="fp16" it is stored as F16 (ggml accumulates in F32), with
precision="q8_0" a constant matrix is stored as Q8_0 (rows of whole 32-weight blocks; others and
vectors as F16), re-quantized on refit. ggml reads a quantized operand only as mul_mat's first
(src0) argument, which is where Bᵀ goes. Activations stay F32, except on the fp16 compute path
(``Builder.f16_activations``): a runtime Bᵀ (a product of two activations) is cast to F16, so
the product is F16 x F16 with F32 accumulation on the CPU and an F16 cuBLAS GEMM on CUDA.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder, WeightTransform
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value, attributes
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


def _swap_last(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(np.asarray(array, dtype=np.float32), -1, -2))


# constant B operands preprocessed at compile time (and on refit)
TRANSPOSED = WeightTransform(_swap_last, lambda shape: (*shape[:-2], shape[-1], shape[-2]))
AS_ROW = WeightTransform(
    lambda w: np.asarray(w, dtype=np.float32).reshape(1, -1), lambda shape: (1, int(np.prod(shape)))
)
AS_FLOAT32 = WeightTransform(lambda w: np.asarray(w, dtype=np.float32), lambda shape: shape)


def matmul(b: Builder, a: Tensor, bt: Tensor, *, runtime_b: bool = False) -> Tensor:
    """a [..., M, K] times bt [..., N, K] (B already transposed) -> [..., M, N]. ``runtime_b``:
    ``bt`` is an activation, cast to F16 on the fp16 compute path."""
    ops.require_float(a, what="MatMul")
    if a.shape[-1] != bt.shape[-1]:
        raise Unsupported(f"MatMul of {list(a.shape)} by a matrix with {bt.shape[-1]} rows")
    batch = ops.broadcast_shape(a.shape[:-2], bt.shape[:-2])
    if len(batch) > 2:
        batch_size = math.prod(batch)
        if a.shape[:-2] != batch or bt.shape[:-2] != batch:
            raise Unsupported("MatMul broadcasting over more than 2 batch dims")
        a = ops.reshape(b, a, (batch_size, *a.shape[-2:]))
        bt = ops.reshape(b, bt, (batch_size, *bt.shape[-2:]))
        return ops.reshape(b, matmul(b, a, bt, runtime_b=runtime_b), (*batch, a.shape[-2], bt.shape[-2]))
    a_batch = (1,) * (len(batch) - (a.rank - 2)) + tuple(a.shape[:-2])
    b_batch = (1,) * (len(batch) - (bt.rank - 2)) + tuple(bt.shape[:-2])
    # ggml broadcasts the first operand (bt) over the second (a): a must carry the full batch.
    if a_batch != batch:
        a = ops.expand(b, ops.reshape(b, a, (*a_batch, *a.shape[-2:])), (*batch, *a.shape[-2:]))
    if any(x % y for x, y in zip(batch, b_batch, strict=True)):
        bt = ops.expand(b, ops.reshape(b, bt, (*b_batch, *bt.shape[-2:])), (*batch, *bt.shape[-2:]))
    else:
        bt = ops.reshape(b, bt, (*b_batch, *bt.shape[-2:]))
    a = ops.reshape(b, a, (*batch, *a.shape[-2:]))
    out = (*batch, a.shape[-2], bt.shape[-2])
    if runtime_b and b.f16_activations and bt.ggml_type == L.GGML_TYPE_F32:
        bt = ops.cast(b, bt, L.GGML_TYPE_F16, bt.dtype)
    return b.op("ggml_mul_mat", bt.ptr, a.ptr, shape=out, dtype=a.dtype)


def transposed_operand(b: Builder, node: Node, index: int, already_transposed: bool = False) -> Tensor:
    """Input ``index`` as Bᵀ ([..., N, K]); constants are transposed at compile time."""
    value = node.value(index)
    half = b.precision in ("fp16", "q8_0")
    if isinstance(value, Tensor):
        if value.rank == 1:
            return ops.reshape(b, value, (1, value.shape[0]))
        if already_transposed:
            return value
        perm = [*range(value.rank - 2), value.rank - 1, value.rank - 2]
        return ops.transpose(b, value, perm)
    # only plain matrices: a batched constant may be broadcast (ggml_repeat has no Q8_0 kernel)
    quantize = b.precision == "q8_0" and np.ndim(value) == 2
    if np.asarray(value).ndim == 1:
        return b.tensor(node, index, transform=AS_ROW, key="mm1", half=half)
    if already_transposed:
        return b.tensor(node, index, transform=AS_FLOAT32, key="mmT", half=half, quantize=quantize)
    return b.tensor(node, index, transform=TRANSPOSED, key="mm", half=half, quantize=quantize)


@converter("MatMul", since_version=1)
def convert_matmul(b: Builder, node: Node) -> list[Value]:
    a = b.tensor(node, 0)
    a_vector = a.rank == 1
    if a_vector:
        a = ops.reshape(b, a, (1, a.shape[0]))
    right = node.value(1)
    b_vector = right.rank == 1 if isinstance(right, Tensor) else np.ndim(right) == 1
    bt = transposed_operand(b, node, 1)
    y = matmul(b, a, bt, runtime_b=isinstance(right, Tensor))
    shape = list(y.shape)
    if b_vector:
        shape.pop(-1)
    if a_vector:
        shape.pop(-2 if not b_vector else -1)
    return [ops.reshape(b, y, shape)]


@converter("Gemm", since_version=7)
def convert_gemm(b: Builder, node: Node) -> list[Value]:
    a = b.tensor(node, 0)
    if node.attr("transA", 0):
        a = ops.transpose(b, a, [1, 0])
    bt = transposed_operand(b, node, 1, already_transposed=bool(node.attr("transB", 0)))
    y = matmul(b, a, bt, runtime_b=isinstance(node.value(1), Tensor))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = ops.scale(b, y, alpha)
    if node.has(2) and beta != 0.0:
        c = b.tensor(node, 2)
        if beta != 1.0:
            c = ops.scale(b, c, beta)
        y = ops.binary(b, "ggml_add", y, c)
    return [y]


def check_einsum(node: onnx.NodeProto) -> str | None:
    equation = str(attributes(node).get("equation", "")).replace(" ", "")
    if "->" not in equation or "." in equation:
        return f"Einsum {equation!r}: only explicit outputs without ellipsis are lowered"
    terms = equation.split("->")[0].split(",")
    if len(terms) > 2 or any(len(set(t)) != len(t) for t in terms):
        return f"Einsum {equation!r}: more than two operands or repeated indices"
    return None


@converter("Einsum", since_version=12, check=check_einsum)
def convert_einsum(b: Builder, node: Node) -> list[Value]:
    return [
        einsum(b, str(node.attr("equation")).replace(" ", ""), [b.tensor(node, i) for i in range(len(node.inputs))])
    ]


def einsum(b: Builder, equation: str, operands: list[Tensor]) -> Tensor:
    """Einsum equations that are a transpose or a (batched) matrix product (the equation's
    form is checked by ``check_einsum``)."""
    inputs, out = equation.split("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise Unsupported(f"Einsum {equation!r}: {len(terms)} terms for {len(operands)} inputs")
    for term, t in zip(terms, operands, strict=True):
        if len(term) != t.rank:
            raise Unsupported(f"Einsum {equation!r}: term {term!r} does not match a rank-{t.rank} input")
    if len(terms) == 1:
        if sorted(out) != sorted(terms[0]):
            raise Unsupported(f"Einsum {equation!r}: single-operand reductions are not lowered")
        return ops.transpose(b, operands[0], [terms[0].index(c) for c in out])
    (ta, tb), (x, y) = terms, operands
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    if any(c not in out for c in left + right):
        raise Unsupported(f"Einsum {equation!r}: summing an index of one operand is not lowered")
    dims = {c: x.shape[i] for i, c in enumerate(ta)} | {c: y.shape[i] for i, c in enumerate(tb)}
    for c in batch + contract:
        if x.shape[ta.index(c)] != y.shape[tb.index(c)]:
            raise Unsupported(f"Einsum {equation!r}: index {c!r} has different sizes")

    def size(letters: list[str]) -> int:
        return math.prod(dims[c] for c in letters)

    xa = ops.reshape(
        b,
        ops.transpose(b, x, [ta.index(c) for c in batch + left + contract]),
        (size(batch), size(left), size(contract)),
    )
    yb = ops.reshape(
        b,
        ops.transpose(b, y, [tb.index(c) for c in batch + right + contract]),
        (size(batch), size(right), size(contract)),
    )
    product = matmul(b, xa, yb, runtime_b=True)
    full = ops.reshape(b, product, [dims[c] for c in batch + left + right])
    order = batch + left + right
    return ops.transpose(b, full, [order.index(c) for c in out])
