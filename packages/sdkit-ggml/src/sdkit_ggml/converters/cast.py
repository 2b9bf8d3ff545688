"""Cast and CastLike between the dtypes ggml stores: floats (F32), float16 (F32 rounded
through F16), bools (F32 0/1) and integers (I32)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import BOOL, SUPPORTED_DTYPES, Node, Tensor, Unsupported, Value, attributes
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L


def _target(to: int) -> np.dtype[np.generic]:
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))


def check_cast(node: onnx.NodeProto) -> str | None:
    target = _target(attributes(node)["to"])
    return None if target in SUPPORTED_DTYPES else f"Cast to {target}: ggml has no such tensors"


def _to_integer(b: Builder, x: Tensor, target: np.dtype[np.generic]) -> Tensor:
    if x.ggml_type == L.GGML_TYPE_I32:
        info = np.iinfo(str(target))
        fits = x.bounds is not None and info.min <= x.bounds[0] and x.bounds[1] <= info.max
        if target.itemsize < 4 and not fits:
            # Storage is I32: a narrowing Cast would have to wrap values, which ggml cannot do.
            raise Unsupported(f"Cast from {x.dtype} to {target}: values are not proven to fit, and ggml cannot wrap")
        return ops.retype(x, target)
    if x.dtype == BOOL:
        return ops.with_bounds(ops.cast(b, x, L.GGML_TYPE_I32, target), (0, 1))
    if target.itemsize < 4:
        raise Unsupported(f"Cast from {x.dtype} to {target}: values are not proven to fit, and ggml cannot wrap")
    # ONNX (and onnxruntime) truncate toward zero; ggml's F32->I32 conversion is a C cast on
    # the CPU but not defined as one everywhere, so the values are made whole first. Values
    # outside int32 are undefined in ONNX too. The result's interval is unknown: integer ops
    # that need one refuse it.
    return ops.cast(b, ops.unary(b, "ggml_trunc", x), L.GGML_TYPE_I32, target)


def cast(b: Builder, x: Tensor, target: np.dtype[np.generic]) -> Tensor:
    """``x`` as ONNX dtype ``target``."""
    if target == x.dtype:
        return x
    if target not in SUPPORTED_DTYPES:
        raise Unsupported(f"Cast to {target}: ggml has no such tensors")
    if target == BOOL:
        if x.ggml_type != L.GGML_TYPE_F32:
            x = ops.cast(b, x, L.GGML_TYPE_F32, np.dtype(np.float32))
        return ops.retype(ops.unary(b, "ggml_step", ops.unary(b, "ggml_abs", x)), BOOL)
    if target.kind in "iu":
        return _to_integer(b, x, target)
    # target is a float type
    if x.ggml_type == L.GGML_TYPE_I32:
        x = ops.cast(b, x, L.GGML_TYPE_F32, np.dtype(np.float32))
    if target == np.float16:
        half = ops.cast(b, x, L.GGML_TYPE_F16, np.dtype(np.float16))
        return ops.cast(b, half, L.GGML_TYPE_F32, np.dtype(np.float16))
    return ops.retype(x, target)


@converter("Cast", since_version=6, check=check_cast)
def convert_cast(b: Builder, node: Node) -> list[Value]:
    return [cast(b, b.tensor(node, 0), _target(node.attr("to")))]


@converter("CastLike", since_version=15)
def convert_castlike(b: Builder, node: Node) -> list[Value]:
    like = np.dtype(node.value(1).dtype)
    constant = b.fixed_value(node, 0)
    if constant is not None and like in SUPPORTED_DTYPES:
        # only the dtype of the second input matters: a constant first input (that refit
        # cannot change) folds to a constant here
        return [constant.astype(like)]
    return [cast(b, b.tensor(node, 0), like)]
