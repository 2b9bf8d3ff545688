"""Static checks of nodes for ``check()``: attribute values and dtypes ggml cannot run,
found without input shapes (the converters raise the same reasons while building)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from sdkit_ggml.compiler.context import BOOL, FLOAT_DTYPES, INT_DTYPES

SUPPORTED_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, BOOL)


def attrs(node: onnx.NodeProto) -> dict[str, Any]:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def check_resize(node: onnx.NodeProto) -> str | None:
    a = attrs(node)
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r}: nearest and linear are lowered"
    if a.get("antialias", 0):
        return "Resize with antialias"
    if "axes" in a or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize with axes or keep_aspect_ratio_policy"
    transform = a.get("coordinate_transformation_mode", "half_pixel")
    if mode == "linear" and transform not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        return f"Resize linear with coordinate_transformation_mode {transform!r}"
    return None


def check_pad(node: onnx.NodeProto) -> str | None:
    mode = attrs(node).get("mode", "constant")
    return None if mode in ("constant", "edge", "reflect", "wrap") else f"Pad mode {mode!r}"


def check_cast(node: onnx.NodeProto) -> str | None:
    target = np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs(node)["to"])))
    return None if target in SUPPORTED_DTYPES else f"Cast to {target}: ggml has no such tensors"


def check_extra_outputs(node: onnx.NodeProto) -> str | None:
    a = attrs(node)
    if a.get("training_mode", 0):
        return f"{node.op_type} in training mode"
    if node.op_type == "BatchNormalization" and len([o for o in node.output if o]) > 1:
        return f"{node.op_type}'s extra statistics outputs are not lowered"
    return None


def check_arg(node: onnx.NodeProto) -> str | None:
    return f"{node.op_type} with select_last_index" if attrs(node).get("select_last_index", 0) else None


def check_einsum(node: onnx.NodeProto) -> str | None:
    equation = str(attrs(node).get("equation", "")).replace(" ", "")
    if "->" not in equation or "." in equation:
        return f"Einsum {equation!r}: only explicit outputs without ellipsis are lowered"
    terms = equation.split("->")[0].split(",")
    if len(terms) > 2 or any(len(set(t)) != len(t) for t in terms):
        return f"Einsum {equation!r}: more than two operands or repeated indices"
    return None


def tensor_dtypes(proto: onnx.ModelProto) -> dict[str, np.dtype[Any]]:
    """Element types of every value ONNX type inference can name (no shapes needed)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # a malformed graph: dtype checks are skipped, compile reports it
        return {}
    found: dict[str, np.dtype[Any]] = {}
    graph = inferred.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        elem = vi.type.tensor_type.elem_type
        if vi.type.HasField("tensor_type") and elem:
            try:
                found[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
            except (KeyError, TypeError, ValueError):
                found[vi.name] = np.dtype(object)
    return found


def unsupported_dtype(node: onnx.NodeProto, dtypes: dict[str, np.dtype[Any]]) -> str | None:
    for name in [*node.input, *node.output]:
        dtype = dtypes.get(name) if name else None
        if dtype is not None and dtype not in SUPPORTED_DTYPES:
            return f"{name!r} is {dtype}: ggml has no such tensors"
    return None
