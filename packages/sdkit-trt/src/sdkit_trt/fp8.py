"""fp8: FP8 (E4M3) matrix weights by rewriting the ONNX graph (explicit quantization).

Pure onnx + numpy (+ ml_dtypes, onnx's own float8 dtype), on the weight-stripped ``Graph``,
so the same plan quantizes any WeightSet later (a refit converts the same names the same way).

The graph is first converted as ``precision="fp16"`` builds it (``sdkit_trt.fp16``): inputs and
outputs float32, activations fp16, norms and reductions float32. Then the 2-D weights of
MatMul/Gemm (the transformer linears: nearly all of Flux/SD3/Chroma's parameters) become
FLOAT8E4M3FN initializers of the same name, read through ``DequantizeLinear(w, scale, axis)``:

* scale per output channel, ``amax / 448`` (448: E4M3's largest finite value), stored as fp16
  so that DequantizeLinear's output, whose type is the scale's, is the fp16 the GEMM reads; an
  all-zero channel gets scale 1, and values are clipped to +-448 before rounding (E4M3FN has
  no infinity: a value past it would become NaN). Rounding is to nearest, ties to even;
* only weights whose every reader is MatMul/Gemm input B, directly or through a 2-D Transpose
  (the shipped family graphs read torch's ``[out, in]`` Linear weights as ``x @ W.T``; the fp16
  plan makes W fp16 and the Transpose compute in fp16, and here the Transpose reads the fp16
  DequantizeLinear output instead), 2-D, with both dimensions multiples of 16 (FP8 tensor-core GEMMs work on
  16-element tiles; smaller or ragged matrices stay fp16). A weight also read elsewhere, or at
  float32 (an fp16 twin), stays as fp16 builds it. Conv kernels, norms, biases and embedding
  tables stay fp16 or float32. The FP8 initializer keeps the weight's name and shape (refit maps
  ONNX initializer names);
* activations are not quantized (weight-only: no QuantizeLinear, no calibration);
* the graph's default opset is raised to 19 with onnx's version converter where it is lower
  (DequantizeLinear takes float8 inputs from opset 19; the converter moves Reduce* ``axes``
  attributes to inputs and gives Split its ``num_outputs``, opset 18's changes).

What TensorRT documents, and what this follows (none of it could be run in this repository):

* TensorRT "Explicit Quantization": Q/DQ networks are meant to be built strongly typed, and
  "precision-control build flags are not required and should not be specified"; pre-quantized
  (FP8) weights need an IDequantizeLayer between the weights and the linear operator that uses
  them, which the ONNX parser creates from DequantizeLinear;
  https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html
* TensorRT 11.0 "Working with Quantized Types": FP8 is E4M3, symmetric, scales per tensor, per
  channel or per block; FP8 quantizes activations and weights (weight-only quantization is
  documented for INT4). So whether a build fuses this weight-only DQ into the GEMM or runs
  DQ + fp16 GEMM is TensorRT's choice, not verified here;
  https://docs.nvidia.com/deeplearning/tensorrt/11.0.0/inference-library/work-quantized-types.html
* TensorRT-RTX "Working with Quantized Types" and its support matrix: FP8 GEMMs need compute
  capability 8.9 (Ada) or newer;
  https://docs.nvidia.com/deeplearning/tensorrt-rtx/latest/inference-library/work-quantized-types.html
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, version_converter

from sdkit.errors import InputError, UnsupportedModelError
from sdkit.model import Graph, WeightSet
from sdkit_trt.fp16 import FP16, Fp16Plan, convert_graph, is_flip, to_fp16, type_error

FP8 = TensorProto.FLOAT8E4M3FN
FP8_MAX = 448.0  # the largest finite E4M3FN value
FP8_OPSET = 19  # DequantizeLinear reads float8 from opset 19
TILE = 16  # both dims of a quantized weight are multiples of this
SCALE_SUFFIX = "__fp8_scale"
DQ_SUFFIX = "__fp8_dq"
Readers = dict[str, list[tuple[onnx.NodeProto, int]]]


@dataclass(frozen=True)
class Fp8Weight:
    """One quantized weight: its output-channel axis (None: one scale for the tensor)."""

    axis: int | None

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return () if self.axis is None else (shape[self.axis],)


@dataclass
class Fp8Plan:
    """The fp8 graph and how to convert weights for it.

    ``quantized`` maps each FLOAT8E4M3FN initializer (same name as the source weight) to how it
    is quantized; ``<name>__fp8_scale`` holds its fp16 scale(s). Other initializers are what the
    fp16 plan makes of them.
    """

    graph: Graph
    fp16: Fp16Plan
    quantized: dict[str, Fp8Weight] = field(default_factory=dict)

    def source_of(self, name: str) -> str:
        """The source weight an initializer of the fp8 graph is computed from."""
        if name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in self.quantized:
            name = name[: -len(SCALE_SUFFIX)]
        return self.fp16.source_of(name)

    def convert_weights(self, weights: Mapping[str, np.ndarray]) -> WeightSet:
        out: dict[str, np.ndarray] = {}
        for name, how in self.quantized.items():
            try:
                out[name], out[f"{name}{SCALE_SUFFIX}"] = quantize_e4m3(np.asarray(weights[name]), how.axis)
            except ValueError as exc:
                raise InputError(f"weight {name!r}: {exc}") from None
        for name in self.graph.initializer_names:
            if name not in out:
                source = self.fp16.fp16_weights.get(name)
                out[name] = np.asarray(weights[name]) if source is None else to_fp16(np.asarray(weights[source]))
        return WeightSet(out)


def quantize_e4m3(weight: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scale)`` with ``q`` float8_e4m3fn and ``scale`` float16, ``weight ~ q * scale``.

    ``axis``: the axis whose entries each get a scale (a 2-D weight's output channels), or None
    for one scale. scale = amax / 448 rounded to fp16 (1 for an all-zero channel, at least the
    smallest fp16 subnormal); q = weight / scale, clipped to +-448, rounded to nearest even."""
    w = np.asarray(weight, np.float32)
    if not np.isfinite(w).all():
        raise ValueError("it has non-finite values, which FP8 E4M3 cannot hold")
    if axis is None:
        amax = np.max(np.abs(w), initial=0.0)
    else:
        amax = np.max(np.abs(w), axis=tuple(a for a in range(w.ndim) if a != axis % w.ndim), initial=0.0)
    tiny = float(np.finfo(np.float16).smallest_subnormal)
    scale = np.clip(np.asarray(amax, np.float32) / FP8_MAX, tiny, float(np.finfo(np.float16).max))
    scale = np.where(amax > 0, scale, 1.0).astype(np.float16)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis % w.ndim] = -1
    q = np.clip(w / scale.astype(np.float32).reshape(shape), -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


def _output_axis(node: onnx.NodeProto) -> int:
    """The output-channel axis of input B: MatMul's B is [K, N]; Gemm's is [N, K] when transB."""
    if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        return 0
    return 1


def _linear_axes(name: str, readers: Readers, outputs: frozenset[str], depth: int = 0) -> set[int] | None:
    """The output-channel axes (in ``name``'s own layout) of the MatMul/Gemm B inputs that read
    ``name``, directly or through a 2-D Transpose (torch's ``x @ W.T``, how the shipped family
    graphs read ``[out, in]`` Linear weights: a weight-layout op, which the fp16 plan computes in
    fp16 with the weight); None when anything else reads it."""
    uses = readers.get(name, [])
    if not uses or name in outputs or depth > 2:
        return None
    axes: set[int] = set()
    for node, i in uses:
        if node.op_type in ("MatMul", "Gemm") and i == 1:
            axes.add(_output_axis(node))
            continue
        if i != 0 or not is_flip(node):
            return None
        below = _linear_axes(node.output[0], readers, outputs, depth + 1)
        if below is None:
            return None
        axes |= {1 - a for a in below}
    return axes


def _candidates(proto: onnx.ModelProto, fp16: Fp16Plan) -> dict[str, Fp8Weight]:
    readers: Readers = {}
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    outputs = frozenset(o.name for o in proto.graph.output)
    found: dict[str, Fp8Weight] = {}
    for tensor in proto.graph.initializer:
        in_place = fp16.fp16_weights.get(tensor.name) == tensor.name and tensor.data_type == FP16
        untouched = tensor.name not in fp16.fp16_weights and tensor.data_type == TensorProto.FLOAT
        if not (in_place or untouched):
            continue  # an fp16 twin, or not a float weight
        dims = [int(d) for d in tensor.dims]
        if len(dims) != 2 or any(d < TILE or d % TILE for d in dims):
            continue
        axes = _linear_axes(tensor.name, readers, outputs)
        if axes is not None and len(axes) == 1:
            found[tensor.name] = Fp8Weight(axes.pop())
    return found


def _upgraded(proto: onnx.ModelProto) -> onnx.ModelProto:
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= FP8_OPSET:
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        return copy
    try:
        return version_converter.convert_version(proto, FP8_OPSET)
    except Exception as exc:  # onnx raises several internal types
        raise UnsupportedModelError(
            "tensorrt",
            [f"fp8 needs opset {FP8_OPSET} and onnx could not convert this opset-{opset} graph ({exc}); "
             "compile with precision='fp16'"],
        ) from None  # fmt: skip


def convert_graph_fp8(graph: Graph) -> Fp8Plan:
    """Plan the fp8 version of a weight-stripped graph (see the module docstring)."""
    fp16 = convert_graph(graph)
    proto = _upgraded(fp16.graph.proto)
    del proto.graph.value_info[:]  # the converter infers types; the parser infers its own
    quantized = _candidates(proto, fp16)
    dq_nodes: list[onnx.NodeProto] = []
    scales: list[TensorProto] = []
    for tensor in proto.graph.initializer:
        how = quantized.get(tensor.name)
        if how is None:
            continue
        tensor.data_type = FP8
        scale = TensorProto()  # metadata only, like every initializer of a stripped graph
        scale.name = f"{tensor.name}{SCALE_SUFFIX}"
        scale.data_type = FP16
        scale.dims.extend(how.scale_shape(tuple(int(d) for d in tensor.dims)))
        scales.append(scale)
        name = f"{tensor.name}{DQ_SUFFIX}"
        node = helper.make_node("DequantizeLinear", [tensor.name, scale.name], [name], name=name)
        if how.axis is not None:
            node.attribute.append(helper.make_attribute("axis", how.axis))
        dq_nodes.append(node)
    proto.graph.initializer.extend(scales)
    for vi in proto.graph.input:  # old exports list initializers as inputs too
        if vi.name in quantized:
            vi.type.tensor_type.elem_type = FP8
    for node in proto.graph.node:  # every reader (MatMul/Gemm B, or the Transpose before one)
        for i, name in enumerate(node.input):
            if name in quantized:
                node.input[i] = f"{name}{DQ_SUFFIX}"
    nodes = [*dq_nodes, *proto.graph.node]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    plan = Fp8Plan(Graph(proto), fp16, quantized)
    if not type_error(fp16.graph.proto):
        error = type_error(proto)
        if error:
            raise UnsupportedModelError(
                "tensorrt",
                [f"the fp8 conversion of this graph does not type-check ({error}); compile with precision='fp16'"],
            )
    return plan
