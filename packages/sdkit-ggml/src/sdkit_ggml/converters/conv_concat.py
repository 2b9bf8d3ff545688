"""``ConvConcat`` (graph pass ``conv_concat``, compiler/pass_fusions.py): a 2-D Conv reading a
channel Concat, lowered as one product per part summed,

    conv(concat(p_0, ..., p_n), W) + bias = sum_i conv(p_i, W[:, C_i]) + bias,

where ``C_i`` are the part's channels. Each part's im2col is built once per graph
(``conv.cached_im2col``) and read by every conv of the same window that takes it, so ESRGAN's
dense blocks (``conv_k(concat(x, x_1, ..., x_{k-1}))``) im2col each feature map once instead of
once per conv that reads it (1728 instead of 5760 values per pixel and block) and copy no
concat. The sums run in another order than one product over the whole concat (rounding-level
differences). The node keeps Conv's inputs 0-2 (first part, kernel, bias; the other parts
follow); wherever the split does not apply (a batch over 1, a runtime kernel, asymmetric
padding, a shape given to ``conv="direct"``, parts whose im2cols together exceed
``SPLIT_BUDGET_CHUNKS`` im2col chunks, a device without the ops) it is the exact Concat + Conv
lowering.
"""

from __future__ import annotations

import os

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder, WeightTransform
from sdkit_ggml.compiler.context import Node, Tensor, Value
from sdkit_ggml.compiler.conv_strategy import ConvShape
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.converters.conv import CHUNK_ENV, DEFAULT_CHUNK_MB, cached_im2col, conv_of, spatial_pads
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L

# the parts' im2cols stay alive together (each is read by later convs): at most this many of
# $SDKIT_GGML_IM2COL_CHUNK_MB (default 64 MB: 256 MB, an RRDB block of 64 features at 192 px)
SPLIT_BUDGET_CHUNKS = 4


@converter("ConvConcat", since_version=1, domain=FUSED_DOMAIN)
def convert_conv_concat(b: Builder, node: Node) -> list[Value]:
    parts = [b.tensor(node, 0)] + [b.tensor(node, i) for i in range(3, len(node.inputs))]
    summed = split_conv(b, node, parts)
    b.conv_concat["split" if summed is not None else "concat_conv"] += 1
    if summed is not None:
        return [summed]
    return [conv_of(b, node, ops.concat(b, parts, 1))]


def _window(node: Node, h: int, w: int, kernel: tuple[int, ...]) -> tuple[int, ...] | None:
    """ggml's (stride x, stride y, pad x, pad y, dilation x, dilation y), or None for padding
    im2col cannot take as is (asymmetric, auto_pad SAME)."""
    strides = [int(s) for s in (node.attr("strides") or [1, 1])]
    dilations = [int(d) for d in (node.attr("dilations") or [1, 1])]
    before, after = spatial_pads(node, [h, w], list(kernel[2:]), strides, dilations)
    if before != after or min(before) < 0 or len(strides) != 2:
        return None
    return (strides[1], strides[0], before[1], before[0], dilations[1], dilations[0])


def split_conv(b: Builder, node: Node, parts: list[Tensor]) -> Tensor | None:
    """The sum of the parts' products, or None where the split does not apply."""
    weight = node.value(1)
    if isinstance(weight, Tensor) or np.ndim(weight) != 4 or int(node.attr("group", 1)) != 1:
        return None
    oc, c, kh, kw = (int(d) for d in np.shape(weight))
    kernel_shape = (oc, c, kh, kw)
    first = parts[0]
    if any(p.rank != 4 or p.ggml_type != L.GGML_TYPE_F32 or p.shape[0] != 1 for p in parts):
        return None
    if any(p.shape[2:] != first.shape[2:] for p in parts) or sum(p.shape[1] for p in parts) != c:
        return None
    h, w = first.shape[2:]
    spd = _window(node, h, w, kernel_shape)
    if spd is None:
        return None
    oh = (h + 2 * spd[3] - spd[5] * (kh - 1) - 1) // spd[1] + 1
    ow = (w + 2 * spd[2] - spd[4] * (kw - 1) - 1) // spd[0] + 1
    if oh <= 0 or ow <= 0:
        return None
    half = b.precision in ("fp16", "q8_0")
    col_type = L.GGML_TYPE_F16 if half else L.GGML_TYPE_F32
    if b.conv_choice is not None:
        shape = ConvShape((1, c, h, w), kernel_shape, (spd[1], spd[0]), (spd[3], spd[2]), (spd[5], spd[4]), col_type)
        if b.conv_choice(shape) == "direct":
            return None
    budget_mb = float(os.environ.get(CHUNK_ENV, DEFAULT_CHUNK_MB) or 0)
    cols_bytes = oh * ow * c * kh * kw * (2 if half else 4)
    if budget_mb > 0 and cols_bytes > SPLIT_BUDGET_CHUNKS * budget_mb * (1 << 20):
        return None
    y: Tensor | None = None
    start = 0
    for part in parts:
        stop = start + part.shape[1]
        kernel = b.tensor(node, 1, transform=_channels(start, stop), key=f"ConvConcat/{start}:{stop}", half=half)
        k = part.shape[1] * kh * kw
        cols = ops.reshape(b, cached_im2col(b, part, kernel, spd, col_type, (1, oh, ow, k)), (oh * ow, k))
        product = b.op("ggml_mul_mat", cols.ptr, ops.reshape(b, kernel, (oc, k)).ptr, shape=(oc, oh * ow))
        y = product if y is None else ops.binary(b, "ggml_add", y, product)
        if not (b.supported(product) and b.supported(y)):  # the device lacks these operands
            return None
        start = stop
    assert y is not None
    out = ops.reshape(b, y, (1, oc, oh, ow))
    if node.has(2):
        bias = b.tensor(node, 2)
        out = ops.binary(b, "ggml_add", out, ops.reshape(b, bias, (1, bias.size, 1, 1)))
    return out


def _channels(start: int, stop: int) -> WeightTransform:
    """The kernel's input channels [start, stop) as float32 (re-applied on refit)."""
    return WeightTransform(
        lambda w: np.ascontiguousarray(np.asarray(w, dtype=np.float32)[:, start:stop]),
        lambda shape: (shape[0], stop - start, *shape[2:]),
    )
