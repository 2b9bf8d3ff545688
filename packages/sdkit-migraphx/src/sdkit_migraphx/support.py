"""``check()``: a pre-flight of what MIGraphX's ONNX parser takes, without MIGraphX.

The operator set is the parser's (MIGraphX 2.16: one ``parse_*.cpp`` rule per op, keyed by
op type whatever the domain, including the com.microsoft contrib ops it knows); the
attribute limits are the ones its support matrix lists (docs/dev/onnx_operators.rst). The
parser, at compile time, has the last word: its errors are mapped to the same sdkit errors.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper

from sdkit.backend import SupportReport
from sdkit.errors import UnsupportedNode
from sdkit.model import Graph
from sdkit_migraphx.runtime import BACKEND_NAME

PARSED_OPS = frozenset(
    """
    ATen Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool
    BatchNormalization BiasAdd BiasGelu BiasSplitGelu Cast CastLike Ceil Celu Clip Concat Constant
    ConstantFill ConstantOfShape Conv ConvInteger ConvTranspose Cos Cosh CumSum DepthToSpace
    DequantizeLinear Div Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike
    FastGelu Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool
    GlobalMaxPool Greater GreaterOrEqual GridSample GroupNorm GroupNormalization GroupQueryAttention
    HardSigmoid HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LRN LSTM
    LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool MatMul
    MatMulInteger MatMulIntegerToFloat MatMulNBits Max MaxPool Mean MeanVarianceNormalization Min Mod
    Mul MultiHeadAttention Multinomial Neg NegativeLogLikelihoodLoss NhwcConv NonMaxSuppression NonZero
    Not OneHot Or PRelu Pad Pow QLinearAdd QLinearAveragePool QLinearConcat QLinearConv
    QLinearGlobalAveragePool QLinearLeakyRelu QLinearMatMul QLinearMul QLinearSigmoid QuantizeLinear
    QuickGelu RNN RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign RotaryEmbedding Round Scan Scatter
    ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign SimplifiedLayerNormalization Sin Sinh Size
    SkipLayerNormalization SkipSimplifiedLayerNormalization Slice Softmax Softplus Softsign
    SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unique
    Unsqueeze Upsample Where Xor
    """.split()  # noqa: SIM905 - a word list reads better than 170 quoted names
)
UNSUPPORTED_TYPES = {"object": "MIGraphX has no string, sequence or map tensors"}


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    found: dict[str, object] = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        found[a.name] = value.decode() if isinstance(value, bytes) else value
    return found


def _resize(node: onnx.NodeProto) -> str | None:
    found = _attrs(node)
    if found.get("mode") == "cubic":
        return "cubic Resize is not supported by MIGraphX"
    transform = found.get("coordinate_transformation_mode")
    if transform in ("half_pixel_symmetric", "tf_crop_and_resize"):
        return f"Resize with coordinate_transformation_mode={transform} is not supported by MIGraphX"
    if found.get("antialias") or found.get("exclude_outside") or "keep_aspect_ratio_policy" in found:
        return "Resize with antialias / exclude_outside / keep_aspect_ratio_policy is not supported by MIGraphX"
    return None


def _pad(node: onnx.NodeProto) -> str | None:
    mode = _attrs(node).get("mode", "constant")
    return f"Pad mode {mode} is not supported by MIGraphX" if mode in ("edge", "wrap") else None


def _reshape(node: onnx.NodeProto) -> str | None:
    return "Reshape with allowzero=1 is not supported by MIGraphX" if _attrs(node).get("allowzero") else None


def _conv_transpose(node: onnx.NodeProto) -> str | None:
    auto = _attrs(node).get("auto_pad", "NOTSET")
    return f"ConvTranspose with auto_pad={auto} is not supported by MIGraphX" if auto != "NOTSET" else None


def _max_pool(node: onnx.NodeProto) -> str | None:
    if _attrs(node).get("storage_order") or (len(node.output) > 1 and node.output[1]):
        return "MaxPool with storage_order or an indices output is not supported by MIGraphX"
    return None


def _cast(node: onnx.NodeProto) -> str | None:
    return "Cast with saturate is not supported by MIGraphX" if "saturate" in _attrs(node) else None


LIMITS: dict[str, Callable[[onnx.NodeProto], str | None]] = {
    "Resize": _resize,
    "Pad": _pad,
    "Reshape": _reshape,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool,
    "Cast": _cast,
    "CastLike": _cast,
}


def check_graph(graph: Graph) -> SupportReport:
    report = SupportReport(BACKEND_NAME)
    for node in graph.nodes:
        opset = graph.opset(node.domain if node.domain not in ("", "ai.onnx") else "")
        if node.op_type not in PARSED_OPS:
            reason = "MIGraphX's ONNX parser has no rule for this operator"
        else:
            limit = LIMITS.get(node.op_type)
            reason = (limit(node) if limit else None) or ""
        if reason:
            report.unsupported.append(UnsupportedNode(node.name, node.op_type, node.domain, opset, reason))
    for info in [*graph.inputs, *graph.outputs]:
        why = UNSUPPORTED_TYPES.get(info.dtype.name)
        if why or info.kind != "tensor":
            report.unsupported.append(
                UnsupportedNode(info.name, "<graph input/output>", "", graph.opset(), f"{info.describe()}: {why}")
            )
    return report
