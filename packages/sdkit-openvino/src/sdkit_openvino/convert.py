"""Graph + WeightSet -> ``openvino.Model``, in memory, with no temporary files.

The weightless graph is serialized with every large initializer marked as *in-memory external
data* (location ``*/_ORT_MEM_ADDR_/*``, offset = the numpy buffer's address, length = its
size), a convention OpenVINO's ONNX frontend shares with onnxruntime. The protobuf message
then holds only the topology, so models whose weights exceed protobuf's 2 GiB limit convert
the same way as small ones, and no weight is copied into a protobuf or written to disk. The
numpy buffers must outlive the conversion. OpenVINO's frontend copies them into its constants
(checked once per process, ``frontend_copies_memory``): then the compiled model does not hold
them (a pipeline component that drops its Model after compiling frees them); a frontend that
referenced them instead would get them held in ``Converted.keepalive``.
"""

from __future__ import annotations

import ctypes
import functools
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sdkit.backend import TensorInfo
from sdkit.errors import (
    InputError,
    ModelFormatError,
    UnsupportedModelError,
    UnsupportedNode,
    UnsupportedOperatorError,
)
from sdkit.model import Graph
from sdkit.onnx_checks import refuse_external
from sdkit_openvino.half_weights import keep_half_weights
from sdkit_openvino.nan_rewrite import keep_nan
from sdkit_openvino.runtime import BACKEND_NAME, first_line, import_openvino

MEMORY_LOCATION = "*/_ORT_MEM_ADDR_/*"
INLINE_BYTES = 4096  # small tensors are embedded: cheap, and no alignment questions
NOT_SUPPORTED_OP = "NotSupportedONNXNode"
# Sub-byte types: ONNX packs them, numpy (ml_dtypes) keeps one per byte, so they are embedded
# through numpy_helper (which packs) instead of referenced in place.
_PACKED = frozenset(
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
)


@dataclass
class Converted:
    """An ``openvino.Model``, the numpy buffers its constants may point into, and where each
    ONNX input/output landed among the model's parameters/results."""

    model: Any
    keepalive: list[np.ndarray] = field(default_factory=list)
    input_index: dict[str, int] = field(default_factory=dict)  # graph input -> parameter index
    output_index: list[int] = field(default_factory=list)  # graph output i -> result index


def _fits(info: TensorInfo, port: Any) -> bool:
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        return True
    if len(shape) != len(info.shape):
        return False
    return all(
        not isinstance(d, int) or shape[i].is_dynamic or shape[i].get_length() == d for i, d in enumerate(info.shape)
    )


def _match(wanted: list[TensorInfo], ports: list[Any], what: str) -> dict[str, int]:
    """ONNX names -> port indices. OpenVINO renames tensors it fuses (an input that flows
    straight to an output through Identity or inference-mode Dropout takes the output's
    name) and drops inputs nothing reads, so names are matched first, then the rest by order
    (which the frontend preserves) when the counts agree, else by shape when that is unique."""
    found: dict[str, int] = {}
    for info in wanted:
        hits = [j for j, port in enumerate(ports) if info.name in port.get_names() and j not in found.values()]
        if hits:
            found[info.name] = hits[0]
    rest = [i for i in wanted if i.name not in found]
    rest_ports = [j for j in range(len(ports)) if j not in found.values()]
    if len(rest_ports) == len(rest):
        found.update(zip((i.name for i in rest), rest_ports, strict=True))
        return found
    for j in rest_ports:
        fitting = [i for i in rest if i.name not in found and _fits(i, ports[j])]
        if len(fitting) != 1:
            names = [i.name for i in rest]
            raise ModelFormatError(f"cannot match the model's {what}s {names} to OpenVINO's ports {rest_ports}")
        found[fitting[0].name] = j
    return found  # graph inputs OpenVINO dropped (unused) are absent


def port_maps(graph: Graph, model: Any) -> tuple[dict[str, int], list[int]]:
    inputs = _match(graph.inputs, list(model.inputs), "input")
    out_names = [o.name for o in graph.outputs]
    outputs = _match(graph.outputs, list(model.outputs), "output")
    missing = [n for n in out_names if n not in outputs]
    if missing:
        raise ModelFormatError(f"OpenVINO's model lost output {missing[0]!r}")
    return inputs, [outputs[n] for n in out_names]


def _expected_dtype(tensor: TensorProto) -> np.dtype[Any]:
    return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))


def checked_weight(tensor: TensorProto, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """The weight for initializer ``tensor``, contiguous, or InputError naming what is wrong."""
    if tensor.name not in weights:
        raise InputError(f"weights are missing initializer {tensor.name!r}")
    # np.ascontiguousarray would turn a 0-d (scalar) weight into shape (1,)
    array = np.asarray(weights[tensor.name])
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")
    want_shape = tuple(int(d) for d in tensor.dims)
    want_dtype = _expected_dtype(tensor)
    if array.shape != want_shape or array.dtype != want_dtype:
        raise InputError(
            f"weight {tensor.name!r} is {array.dtype}{list(array.shape)}, "
            f"the model expects {want_dtype}{list(want_shape)}"
        )
    return array


def memory_reference(name: str, data_type: int, array: np.ndarray) -> TensorProto:
    """An initializer whose data is ``array``'s buffer in this process (not copied)."""
    tensor = TensorProto(name=name, data_type=data_type, dims=list(array.shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", MEMORY_LOCATION),
        ("offset", str(array.ctypes.data)),
        ("length", str(array.nbytes)),
    ):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def memory_onnx(graph: Graph, weights: Mapping[str, np.ndarray]) -> tuple[bytes, list[np.ndarray]]:
    """The serialized ModelProto with weights inlined (small) or referenced in memory (large)."""
    # Only the references made below may point at memory: any other external tensor (a sparse
    # Constant at */_ORT_MEM_ADDR_/* in a Graph built without sdkit's loader) is refused here.
    refuse_external(graph.proto, "the graph", initializers=False)
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.proto)
    keep_nan(proto)  # Relu/Clip/Max/Min keep NaN as ONNX says (nan_rewrite.py)
    keepalive: list[np.ndarray] = []
    for tensor in proto.graph.initializer:
        array = checked_weight(tensor, weights)
        if array.nbytes < INLINE_BYTES or array.dtype.kind in "OUS" or tensor.data_type in _PACKED:
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
            continue
        tensor.CopyFrom(memory_reference(tensor.name, tensor.data_type, array))
        keepalive.append(array)
    try:
        return proto.SerializeToString(), keepalive
    except ValueError as exc:  # protobuf refuses messages over 2 GiB (huge Constant nodes)
        raise ModelFormatError(f"the graph itself is too large to serialize: {exc}") from None


def _onnx_frontend() -> Any:
    import_openvino()
    from openvino.frontend import FrontEndManager

    return FrontEndManager().load_by_framework("onnx")


def _failure_reasons(message: str) -> dict[str, str]:
    """Op key (``Reshape-17``, ``my.dom.Foo``) -> reason, from the frontend's conversion report."""
    reasons: dict[str, str] = {}
    for line in message.splitlines():
        match = re.match(r"\s*-- No conversion rule found for operations: (.*)", line)
        if match:
            for op in match.group(1).split(","):
                reasons.setdefault(op.strip(), "OpenVINO's ONNX frontend has no conversion rule for this operator")
    for block in re.finditer(r"-- (\S+) with a message:\n(.*?)(?=\n-- |\nSummary:|\Z)", message, re.S):
        lines = [ln.strip() for ln in block.group(2).splitlines() if ln.strip()]
        reasons[block.group(1)] = f"conversion failed: {lines[-1][:300] if lines else 'no message'}"
    return reasons


def _reason_for(reasons: Mapping[str, str], op_type: str, domain: str) -> str:
    for key, reason in reasons.items():
        bare = re.sub(r"-\d+$", "", key)
        if bare in (op_type, f"{domain}.{op_type}"):
            return reason
    return "OpenVINO's ONNX frontend cannot convert this node"


def unsupported_nodes(graph: Graph, partial: Any, message: str) -> list[UnsupportedNode]:
    """Map each ``NotSupportedONNXNode`` of a partially converted model to its ONNX node."""
    reasons = _failure_reasons(message)
    opsets = {e.domain or "": int(e.version) for e in graph.proto.opset_import}
    by_name: dict[str, onnx.NodeProto] = {}
    for onnx_node in graph.nodes:
        for key in (onnx_node.name, *onnx_node.output):
            if key:
                by_name.setdefault(key, onnx_node)
    found: list[UnsupportedNode] = []
    seen: set[int] = set()
    for op in partial.get_ops():
        if op.get_type_name() != NOT_SUPPORTED_OP:
            continue
        attrs = op.get_attributes()
        op_type = str(attrs.get("ONNX_META_type", "?"))
        domain = str(attrs.get("ONNX_META_domain", ""))
        node: onnx.NodeProto | None = by_name.get(op.get_friendly_name())
        if node is None or id(node) in seen:  # fall back to the first unreported node of that type
            node = next((n for n in graph.nodes if n.op_type == op_type and id(n) not in seen), None)
        if node is not None:
            seen.add(id(node))
        name = node.name if node is not None else op.get_friendly_name()
        dom = domain if domain != "ai.onnx" else ""
        found.append(UnsupportedNode(name, op_type, dom, opsets.get(dom, 0), _reason_for(reasons, op_type, dom)))
    return found


def convert_bytes(graph: Graph, model_bytes: bytes) -> Any:
    """Convert serialized ONNX to an ``openvino.Model``; every unconvertible node at once."""
    frontend = _onnx_frontend()
    try:
        input_model = frontend.load(io.BytesIO(model_bytes))
    except Exception as exc:
        raise ModelFormatError(f"OpenVINO cannot read this ONNX model: {first_line(exc)}") from None
    try:
        return frontend.convert(input_model)
    except Exception as exc:
        message = str(exc)
    try:
        partial = frontend.convert_partially(frontend.load(io.BytesIO(model_bytes)))
        problems = unsupported_nodes(graph, partial, message)
    except Exception:
        problems = []
    if problems:
        raise UnsupportedOperatorError(BACKEND_NAME, problems)
    reasons = _failure_reasons(message)
    if reasons:  # failures inside function bodies (expanded ops) have no node of their own
        raise UnsupportedModelError(BACKEND_NAME, [f"{op}: {why}" for op, why in reasons.items()])
    raise ModelFormatError(f"OpenVINO cannot convert this model: {first_line(Exception(message))}")


@functools.cache
def frontend_copies_memory() -> bool:
    """Whether the ONNX frontend copies in-memory external data into its own constants (then
    the numpy buffers may go once the conversion returns): a weight is converted, its buffer
    zeroed, and the converted constant read back."""
    from sdkit.model import Model

    weight = np.ones(INLINE_BYTES // 4 + 1, dtype=np.float32)  # past INLINE_BYTES: referenced
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(weight.shape)) for n in ("x", "y")]
    initializer = [helper.make_tensor("w", TensorProto.FLOAT, list(weight.shape), [0.0] * weight.size)]
    proto = helper.make_model(
        helper.make_graph(nodes, "probe", info[:1], info[1:], initializer),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    graph = Model.from_proto(proto).graph
    model_bytes, _ = memory_onnx(graph, {"w": weight})
    model = convert_bytes(graph, model_bytes)
    ctypes.memset(weight.ctypes.data, 0, weight.nbytes)
    constants = [op for op in model.get_ordered_ops() if op.get_type_name() == "Constant"]
    return any(float(np.asarray(op.get_data()).ravel()[0]) == 1.0 for op in constants)


def convert(graph: Graph, weights: Mapping[str, np.ndarray]) -> Converted:
    """Graph + weights -> ``Converted`` (the model and the buffers it may reference)."""
    model_bytes, keepalive = memory_onnx(graph, weights)
    model = convert_bytes(graph, model_bytes)
    keep_half_weights(model)  # fp16/bf16 MatMul weights stay half-width (half_weights.py)
    inputs, outputs = port_maps(graph, model)
    return Converted(model, [] if frontend_copies_memory() else keepalive, inputs, outputs)
