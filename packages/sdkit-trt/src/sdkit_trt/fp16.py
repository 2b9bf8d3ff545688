"""fp16 by rewriting the ONNX graph and its weights (TensorRT-RTX and TensorRT 11 build
strongly typed networks: there is no fp16 builder flag, the graph's types are the precision).

Pure onnx + numpy, on the weight-stripped ``Graph``, so the same plan converts any WeightSet
later (refit with a user's checkpoint converts the same names the same way).

Rules, decided per node in topological order; every float32 tensor gets a precision:

* graph inputs and outputs stay float32: a Cast to fp16 follows an input where an fp16 node
  reads it, a Cast back to float32 precedes every output computed in fp16;
* heavy ops (Conv, ConvTranspose, MatMul, Gemm, Einsum, Attention) always compute in fp16;
  their weights become fp16 initializers of the same name;
* precision-sensitive ops compute in float32 (``KEEP_FP32``): normalisations
  (Instance/Layer/Group, whose variance overflows fp16: a sum of squares of activations in
  the hundreds passes 65504), reductions and Pow (hand-written norms: ``ReduceMean(Pow(x, 2))``),
  Range and CumSum (index arithmetic), Sin/Cos (timestep embeddings: ``t * freq`` with t near
  1000 loses the phase in fp16); their scale/bias weights stay float32;
* Resize's ``roi``/``scales`` and Upsample's ``scales`` stay float32 (ONNX requires float for
  scales, and a 2x factor must stay exact);
* every other op follows its inputs: fp16 when any float activation input is fp16, else
  float32. So float32 spreads forward from the graph inputs, from Cast(int -> float) (shape
  arithmetic stays exact) and from KEEP_FP32 ops, up to the next heavy op;
* a weight-layout op (``WEIGHT_LAYOUT_OPS``: Transpose, Reshape, ...) whose data input is an
  initializer or Constant, directly or through other such ops, is part of that weight: it
  computes at the precision its readers need. The shipped family graphs read torch's
  ``[out, in]`` Linear weights as ``MatMul(x, Transpose(W))``: W becomes an fp16 initializer of
  the same name and the Transpose computes in fp16, no Cast on the way;
* an initializer (or Constant) read at both precisions is kept float32 and gets an fp16 twin
  ``<name>__fp16`` (a weight-layout op on it too: ``<output>__fp16`` reads the twin); fp16
  weights are clipped to +-65504 (no inf from out-of-range values);
* control flow (If/Loop/Scan) is refused with a clear error: compile those with fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sdkit.errors import UnsupportedModelError, UnsupportedNode
from sdkit.model import Graph, WeightSet

FP32, FP16 = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = float(np.finfo(np.float16).max)
HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Attention"})
KEEP_FP32 = frozenset(
    {
        "InstanceNormalization", "LayerNormalization", "GroupNormalization", "RMSNormalization",
        "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceProd", "Pow", "Range", "CumSum", "Sin", "Cos",
    }
)  # fmt: skip
FIXED_FP32_INPUTS: dict[str, frozenset[int]] = {"Resize": frozenset({1, 2}), "Upsample": frozenset({1})}
DTYPE_ATTRS = {"RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "EyeLike": "dtype"}
TWIN_SUFFIX = "__fp16"
# Ops that only move a tensor's values (their other inputs are int64 shapes/axes): applied to a
# weight, they are part of the weight's layout, not computation on an activation.
WEIGHT_LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten", "Slice"})
SHAPE_OPS = frozenset({"Shape", "Size"})  # read a tensor's shape only: no precision needed


@dataclass
class Fp16Plan:
    """The converted graph and how to convert weights for it.

    ``fp16_weights`` maps each fp16 initializer of the new graph to the source weight it is
    cast from (the same name, or ``<name>__fp16`` for a twin); other weights pass unchanged.
    """

    graph: Graph
    fp16_weights: dict[str, str] = field(default_factory=dict)
    kept_fp32_nodes: list[str] = field(default_factory=list)

    def source_of(self, name: str) -> str:
        """The source weight an initializer of the converted graph is computed from."""
        return self.fp16_weights.get(name, name)

    def convert_weights(self, weights: Mapping[str, np.ndarray]) -> WeightSet:
        out: dict[str, np.ndarray] = {}
        for name in self.graph.initializer_names:
            source = self.fp16_weights.get(name)
            if source is None:
                out[name] = np.asarray(weights[name])
            else:
                out[name] = to_fp16(np.asarray(weights[source]))
        return WeightSet(out)


def to_fp16(array: np.ndarray) -> np.ndarray:
    """float32 -> float16, clipping finite values to the fp16 range (inf/nan preserved)."""
    clipped = np.where(np.isfinite(array), np.clip(array, -FP16_MAX, FP16_MAX), array)
    return clipped.astype(np.float16)


def is_weight_layout(node: onnx.NodeProto, is_weight: Callable[[str], bool]) -> bool:
    """Whether ``node`` only lays out a weight: a ``WEIGHT_LAYOUT_OPS`` node whose data input
    (input 0) ``is_weight`` (an initializer or Constant, or the output of such a node)."""
    return node.op_type in WEIGHT_LAYOUT_OPS and bool(node.input) and is_weight(node.input[0])


def is_flip(node: onnx.NodeProto) -> bool:
    """A 2-D Transpose (perm [1, 0], or no perm: reversed axes): torch's ``W.T``."""
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
    return node.op_type == "Transpose" and perm == [1, 0]


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor that shape inference can type."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # inference failures leave types unknown; the result is checked later
        inferred = proto
    graph = inferred.graph
    types: dict[str, int] = {t.name: t.data_type for t in graph.initializer}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            types[node.output[0]] = node.attribute[0].t.data_type
    return types


class _Converter:
    def __init__(self, graph: Graph) -> None:
        self.src = graph.proto
        self.types = _elem_types(self.src)
        self.initializers = {t.name: t for t in self.src.graph.initializer}
        self.constants = {n.output[0]: n for n in self.src.graph.node if _is_tensor_constant(n)}
        self.zone: dict[str, int] = {}  # float activation -> FP32 or FP16
        self.needs: dict[str, set[int]] = {}  # initializer/constant/layout -> precisions read at
        self.layouts: dict[str, tuple[int, str]] = {}  # weight-layout output -> (node index, source)
        self.casts: dict[tuple[str, int], str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.kept: list[str] = []

    def is_float(self, name: str) -> bool:
        return self.types.get(name) == FP32

    def is_constant(self, name: str) -> bool:
        """An initializer, a Constant, or a weight-layout op's output: precision set by readers."""
        return name in self.initializers or name in self.constants or name in self.layouts

    def is_weight(self, name: str) -> bool:
        return self.is_float(name) and self.is_constant(name)

    def cast(self, name: str, to: int) -> str:
        """A Cast of activation ``name`` to ``to`` (one per tensor and precision)."""
        key = (name, to)
        if key not in self.casts:
            out = f"{name}__to_{'fp16' if to == FP16 else 'fp32'}"
            self.nodes.append(helper.make_node("Cast", [name], [out], name=f"{out}_cast", to=to))
            self.casts[key] = out
        return self.casts[key]

    def precision_of(self, node: onnx.NodeProto) -> int:
        if node.op_type in HEAVY_OPS:
            return FP16
        if node.op_type in KEEP_FP32:
            return FP32
        fixed = FIXED_FP32_INPUTS.get(node.op_type, frozenset())
        for i, name in enumerate(node.input):
            if name and i not in fixed and not self.is_constant(name) and self.zone.get(name) == FP16:
                return FP16
        return FP32

    def convert_node(self, node: onnx.NodeProto) -> None:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise UnsupportedModelError(
                "tensorrt",
                [
                    UnsupportedNode(
                        node.name,
                        node.op_type,
                        node.domain,
                        0,
                        "fp16 conversion does not handle control flow; compile with precision='fp32'",
                    )
                ],
            )
        if node.op_type == "Constant" and node.output[0] in self.constants:
            return  # emitted at the end, at the precision(s) its readers need
        if is_weight_layout(node, self.is_weight) and len(node.output) == 1 and self.is_float(node.output[0]):
            self.layouts[node.output[0]] = (len(self.nodes), node.input[0])
            new = onnx.NodeProto()
            new.CopyFrom(node)
            self.nodes.append(new)  # its precision is resolved in ``finish``
            return
        precision = self.precision_of(node)
        if node.op_type in KEEP_FP32:
            self.kept.append(node.name or node.op_type)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        fixed = FIXED_FP32_INPUTS.get(node.op_type, frozenset())
        for i, name in enumerate(node.input):
            if not name or not self.is_float(name):
                continue
            want = FP32 if i in fixed else precision
            if self.is_constant(name):
                if node.op_type in SHAPE_OPS:
                    continue  # the original name always exists (an fp16-only weight keeps it)
                self.needs.setdefault(name, set()).add(want)
                if want == FP16:
                    new.input[i] = self.fp16_name(name)
            elif self.zone.get(name, FP32) != want:
                new.input[i] = self.cast(name, want)
        if node.op_type == "Cast":
            self.convert_cast(node, new)
        else:
            for attr in new.attribute:
                if attr.name == DTYPE_ATTRS.get(node.op_type) and attr.i == FP32 and precision == FP16:
                    attr.i = FP16
            for out in node.output:
                if out and self.is_float(out):
                    self.zone[out] = precision
        self.nodes.append(new)

    def convert_cast(self, node: onnx.NodeProto, new: onnx.NodeProto) -> None:
        """Cast(float -> float) keeps the input's precision; Cast(int -> float) is float32."""
        source = node.input[0]
        out = node.output[0]
        if not self.is_float(out):
            return
        if self.is_float(source) and not self.is_constant(source) and self.zone.get(source) == FP16:
            for attr in new.attribute:
                if attr.name == "to":
                    attr.i = FP16
            self.zone[out] = FP16
        else:
            self.zone[out] = FP32

    def fp16_name(self, name: str) -> str:
        """The name an fp16 reader of constant ``name`` uses (resolved in ``finish``)."""
        return f"{name}{TWIN_SUFFIX}"

    def finish(self) -> Fp16Plan:
        proto = onnx.ModelProto()
        proto.CopyFrom(self.src)
        graph = proto.graph
        fp16_weights: dict[str, str] = {}
        renames: dict[str, str] = {}
        self.resolve_layouts(renames)
        del graph.initializer[:]
        for tensor in self.src.graph.initializer:
            needs = self.needs.get(tensor.name, set())
            if needs == {FP16}:
                renames[f"{tensor.name}{TWIN_SUFFIX}"] = tensor.name  # converted in place
                graph.initializer.append(_retyped(tensor, tensor.name))
                fp16_weights[tensor.name] = tensor.name
                continue
            graph.initializer.append(tensor)
            if FP16 in needs:
                twin = f"{tensor.name}{TWIN_SUFFIX}"
                graph.initializer.append(_retyped(tensor, twin))
                fp16_weights[twin] = tensor.name
        constants: list[onnx.NodeProto] = []
        for name, node in self.constants.items():
            needs = self.needs.get(name, set()) if self.is_float(name) else {FP32}
            if needs != {FP16}:
                constants.append(node)
            if FP16 in needs:
                value = numpy_helper.to_array(node.attribute[0].t)
                out = name if needs == {FP16} else f"{name}{TWIN_SUFFIX}"
                if needs == {FP16}:
                    renames[f"{name}{TWIN_SUFFIX}"] = name
                tensor = numpy_helper.from_array(to_fp16(value), out)
                constants.append(helper.make_node("Constant", [], [out], name=f"{out}_const", value=tensor))
        for vi in graph.input:  # old exports list initializers as inputs too
            if fp16_weights.get(vi.name) == vi.name:
                vi.type.tensor_type.elem_type = FP16
        for node in self.nodes:
            for i, name in enumerate(node.input):
                if name in renames:
                    node.input[i] = renames[name]
        outputs = self.cast_outputs()
        del graph.node[:]
        graph.node.extend([*constants, *self.nodes, *outputs])
        del graph.value_info[:]  # intermediate types changed; the parser infers its own
        return Fp16Plan(Graph(proto), fp16_weights, self.kept)

    def resolve_layouts(self, renames: dict[str, str]) -> None:
        """Give each weight-layout node the precision(s) its readers need and pass them on to
        its source, last node first (a chain resolves from its end). Read only in fp16: the node
        reads its source in fp16 and keeps its output name; at both precisions: an fp16 twin
        node ``<output>__fp16`` reads the source's fp16 version."""
        outputs = {o.name for o in self.src.graph.output}
        twins: dict[int, onnx.NodeProto] = {}
        for out, (index, source) in reversed(self.layouts.items()):
            needs = self.needs.get(out, set())
            if out in outputs or not needs:
                needs = needs | {FP32}  # graph outputs stay float32
            self.needs.setdefault(source, set()).update(needs)
            node = self.nodes[index]
            if needs == {FP16}:
                node.input[0] = self.fp16_name(source)
                renames[self.fp16_name(out)] = out
            elif FP16 in needs:
                twin = onnx.NodeProto()
                twin.CopyFrom(node)
                twin.input[0] = self.fp16_name(source)
                twin.output[0] = self.fp16_name(out)
                twin.name = f"{node.name}{TWIN_SUFFIX}" if node.name else ""
                twins[index] = twin
        if twins:
            self.nodes = [m for i, n in enumerate(self.nodes) for m in (n, twins.get(i)) if m is not None]

    def cast_outputs(self) -> list[onnx.NodeProto]:
        """Rename fp16 producers of graph outputs and Cast them back to float32."""
        casts: list[onnx.NodeProto] = []
        for out in self.src.graph.output:
            if self.zone.get(out.name) != FP16:
                continue
            inner = f"{out.name}{TWIN_SUFFIX}"
            for node in self.nodes:
                for i, name in enumerate(node.output):
                    if name == out.name:
                        node.output[i] = inner
                for i, name in enumerate(node.input):
                    if name == out.name:
                        node.input[i] = inner
            casts.append(helper.make_node("Cast", [inner], [out.name], name=f"{out.name}_to_fp32", to=FP32))
        return casts


def _is_tensor_constant(node: onnx.NodeProto) -> bool:
    """A Constant holding a ``value`` tensor (value_float & co. are left as ordinary nodes)."""
    return (
        node.op_type == "Constant"
        and len(node.attribute) == 1
        and node.attribute[0].name == "value"
        and bool(node.output)
    )


def _retyped(tensor: TensorProto, name: str) -> TensorProto:
    """Initializer metadata (stripped: no data) with dtype float16."""
    out = TensorProto()
    out.CopyFrom(tensor)
    out.name = name
    out.data_type = FP16
    return out


def type_error(proto: onnx.ModelProto) -> str:
    """ONNX's strict type and shape inference error for ``proto``, or "" when it passes."""
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx raises several internal types
        return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return ""


def convert_graph(graph: Graph) -> Fp16Plan:
    """Plan the fp16 version of a weight-stripped graph (see the module docstring).

    Where ONNX type-checks the original graph, the converted one must type-check too: a
    tensor whose type inference could not see would otherwise reach TensorRT mistyped."""
    converter = _Converter(graph)
    for node in graph.proto.graph.node:
        converter.convert_node(node)
    plan = converter.finish()
    if not type_error(graph.proto):
        error = type_error(plan.graph.proto)
        if error:
            raise UnsupportedModelError(
                "tensorrt",
                [f"the fp16 conversion of this graph does not type-check ({error}); compile with precision='fp32'"],
            )
    return plan
