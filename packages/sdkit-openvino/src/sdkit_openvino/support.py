"""``check()``: every node OpenVINO's ONNX frontend (or the device) rejects, all at once.

``check`` sees only the Graph, not the weights. Floating-point initializers up to 1 MiB are
pointed at one shared zero buffer; larger ones become graph inputs of their shape (the
frontend copies every constant: FLUX.1's 11.9B weights as zero constants would take 48 GB);
integer initializers (shapes, axes, indices, whose values steer shape inference) become graph
inputs, so no made-up value can make a valid Reshape look invalid. The frontend then converts
partially: each node it cannot convert becomes a ``NotSupportedONNXNode`` that maps back to
the ONNX node. A fully converted model is also asked ``Core.query_model`` for the first
device, to catch ops the device plugin lacks.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from sdkit.backend import SupportReport
from sdkit.errors import UnsupportedNode
from sdkit.model import Graph
from sdkit_openvino.convert import _onnx_frontend, memory_reference, unsupported_nodes
from sdkit_openvino.runtime import BACKEND_NAME, first_line, get_core, list_devices

_VALUE_KINDS = "fc"  # float and complex initializers: their values never steer conversion


# Float weights above this become graph inputs in check(): OpenVINO's frontend copies every
# constant, so zero placeholders for FLUX.1's 11.9B weights would need 48 GB to check a graph.
_PLACEHOLDER_LIMIT = 1 << 20


def placeholder_onnx(graph: Graph) -> tuple[bytes, np.ndarray]:
    """The graph with placeholder weights (see module docstring) and the zero buffer they use."""
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.proto)
    sizes = [
        int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in proto.graph.initializer
    ]
    zeros = np.zeros(max([64, *(n for n in sizes if n <= _PLACEHOLDER_LIMIT)]), dtype=np.uint8)
    listed = {vi.name for vi in proto.graph.input}
    kept: list[TensorProto] = []
    for tensor, size in zip(proto.graph.initializer, sizes, strict=True):
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        if dtype.kind in _VALUE_KINDS and size <= _PLACEHOLDER_LIMIT:
            count = int(np.prod(tensor.dims, dtype=np.int64))
            view = zeros[: count * dtype.itemsize].view(dtype).reshape(tuple(tensor.dims))
            kept.append(memory_reference(tensor.name, tensor.data_type, view))
        elif tensor.name not in listed:
            proto.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    return proto.SerializeToString(), zeros


def device_gaps(graph: Graph, model: Any, vendor_name: str) -> list[UnsupportedNode]:
    """Ops of a converted model that the device's plugin does not support (``query_model``)."""
    supported = get_core().query_model(model, vendor_name)
    gaps: list[UnsupportedNode] = []
    by_output = {out: node for node in graph.nodes for out in (node.name, *node.output) if out}
    opsets = {e.domain or "": int(e.version) for e in graph.proto.opset_import}
    for op in model.get_ops():
        if op.get_type_name() in ("Parameter", "Result", "Constant") or op.get_friendly_name() in supported:
            continue
        node = by_output.get(op.get_friendly_name())
        reason = f"the {vendor_name} plugin does not support OpenVINO op {op.get_type_name()}"
        if node is not None:
            gaps.append(UnsupportedNode(node.name, node.op_type, node.domain, opsets.get(node.domain or "", 0), reason))
        else:
            gaps.append(UnsupportedNode(op.get_friendly_name(), op.get_type_name(), "openvino", 0, reason))
    return gaps


def check_graph(graph: Graph) -> SupportReport:
    report = SupportReport(BACKEND_NAME)
    model_bytes, zeros = placeholder_onnx(graph)
    frontend = _onnx_frontend()
    try:
        model = frontend.convert(frontend.load(io.BytesIO(model_bytes)))
    except Exception as exc:
        message = str(exc)
        try:
            partial = frontend.convert_partially(frontend.load(io.BytesIO(model_bytes)))
            report.unsupported.extend(unsupported_nodes(graph, partial, message))
        except Exception as inner:
            report.notes.append(f"OpenVINO cannot convert this graph: {first_line(inner)}")
            report.unsupported.append(UnsupportedNode("", "<graph>", "", 0, first_line(exc)))
        del zeros  # the buffer must outlive conversion only
        return report
    try:
        devices = list_devices()
        if devices:
            report.unsupported.extend(device_gaps(graph, model, devices[0].vendor_name))
    except Exception as exc:  # query_model on a partially dynamic model can fail: not a verdict
        report.notes.append(f"query_model failed: {first_line(exc)}")
    del model, zeros
    return report
