"""Conv and ConvTranspose (1-D and 2-D) as exact F32 im2col + mul_mat, or per shape through
GGML_OP_CONV_2D (``ggml_conv_2d_direct``: the same F32 products, tiled; see
compiler/conv_strategy.py for the choice).

ggml_conv_2d builds im2col in F16 even for F32 kernels (~5e-3 error), so the im2col here is
requested in F32 (F16 only with precision="fp16"). ConvTranspose is lowered exactly too: zeros
inserted between input pixels, then a stride-1 conv with the flipped kernel.
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder, WeightTransform
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.compiler.conv_strategy import ConvShape
from sdkit_ggml.converters.conv_groups import many_group_conv2d
from sdkit_ggml.converters.pad import pad_constant
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L

# Up to this many groups, a grouped conv is lowered one group at a time (each group's conv
# takes the direct kernel or a chunked im2col); beyond, in a fixed number of nodes
# (converters/conv_groups.py). A depthwise conv (groups == in == out channels, MobileNet's)
# takes the fixed-node lowering at any group count. ConvTranspose lowers at most this many.
MAX_GROUPS = 64
# im2col of a big feature map (1.2 GB for the SD VAE's last convs at 512 px) is built in chunks
# of at most this many MB (issue 17: peak memory at or below onnxruntime's).
CHUNK_ENV = "SDKIT_GGML_IM2COL_CHUNK_MB"
DEFAULT_CHUNK_MB = 64


def check_conv(node: onnx.NodeProto) -> str | None:
    attrs = {a.name: a for a in node.attribute}
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else None
    if kernel is not None and len(kernel) not in (1, 2):
        return f"{len(kernel)}-D {node.op_type}: only 1-D and 2-D are lowered to ggml"
    return None


def spatial_pads(
    node: Node, in_sizes: list[int], kernel: list[int], strides: list[int], dilations: list[int]
) -> tuple[list[int], list[int]]:
    """(before, after) pads of the spatial axes: explicit ``pads`` or ``auto_pad`` SAME/VALID
    (shared with pooling, whose dilation is 1)."""
    n = len(kernel)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        before, after = [], []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            before.append(small if auto_pad == "SAME_UPPER" else big)
            after.append(big if auto_pad == "SAME_UPPER" else small)
        return before, after
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    pads = [int(p) for p in (node.attr("pads") or [0] * (2 * n))]
    return pads[:n], pads[n:]


def conv2d(
    b: Builder, x: Tensor, kernel: Tensor, *, stride: tuple[int, int], pad: tuple[int, int], dilation: tuple[int, int]
) -> Tensor:
    """x [N,C,H,W] * kernel [OC,C,KH,KW] -> [N,OC,OH,OW] (symmetric padding)."""
    n, c, h, w = x.shape
    oc, kc, kh, kw = kernel.shape
    if kc != c:
        raise Unsupported(f"Conv: input has {c} channels, the kernel expects {kc}")
    oh = (h + 2 * pad[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pad[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise Unsupported(f"Conv: a {kh}x{kw} kernel does not fit input {h}x{w} (padding {pad})")
    col_type = L.GGML_TYPE_F16 if kernel.ggml_type == L.GGML_TYPE_F16 else L.GGML_TYPE_F32
    if b.conv_choice is not None:
        shape = ConvShape((n, c, h, w), (oc, kc, kh, kw), stride, pad, dilation, kernel.ggml_type)
        if b.conv_choice(shape) == "direct":
            spd = (stride[1], stride[0], pad[1], pad[0], dilation[1], dilation[0])
            return b.op("ggml_conv_2d_direct", kernel.ptr, x.ptr, *spd, shape=(n, oc, oh, ow))
    k = c * kh * kw
    rows = chunk_rows(oh, ow * k * (2 if col_type == L.GGML_TYPE_F16 else 4))
    if n == 1 and rows < oh:
        return chunked_conv2d(b, x, kernel, rows, stride=stride, pad=pad, dilation=dilation, out_hw=(oh, ow))
    spd = (stride[1], stride[0], pad[1], pad[0], dilation[1], dilation[0])
    cols2 = ops.reshape(b, cached_im2col(b, x, kernel, spd, col_type, (n, oh, ow, k)), (n * oh * ow, k))
    kernel2 = ops.reshape(b, kernel, (oc, k))
    # mul_mat(cols, kernel) yields channels-first [OC, N*OH*OW] directly; the other operand
    # order needs a transpose afterwards that costs ~40% of the matmul (measured).
    product = b.op("ggml_mul_mat", cols2.ptr, kernel2.ptr, shape=(oc, n * oh * ow))
    if n == 1:
        return ops.reshape(b, product, (1, oc, oh, ow))
    return ops.transpose(b, ops.reshape(b, product, (oc, n, oh, ow)), (1, 0, 2, 3))


def cached_im2col(
    b: Builder, x: Tensor, kernel: Tensor, spd: tuple[int, ...], col_type: int, shape: tuple[int, int, int, int]
) -> Tensor:
    """ggml_im2col of ``x`` for ``kernel``'s window (``spd``: ggml's strides, pads, dilations),
    built once per graph: a second conv of the same window and type reading the same tensor
    (ESRGAN's dense blocks, through ``ConvConcat``) reuses it (``Builder.im2col_cache``)."""
    key = (x.ptr, kernel.shape[1], kernel.shape[2], kernel.shape[3], spd, col_type)
    found = b.im2col_cache.get(key)
    if found is not None:
        return found
    cols = b.op("ggml_im2col", kernel.ptr, x.ptr, *spd, True, col_type, shape=shape)
    if not b.supported(cols):  # a GPU's im2col reads contiguous operands only
        cols = b.op("ggml_im2col", ops.cont(b, kernel).ptr, ops.cont(b, x).ptr, *spd, True, col_type, shape=shape)
    b.im2col_cache[key] = cols
    return cols


def chunk_rows(out_rows: int, row_bytes: int) -> int:
    """Output rows per im2col chunk: the whole output when its im2col fits the budget
    ($SDKIT_GGML_IM2COL_CHUNK_MB, default 64; 0 turns chunking off)."""
    budget_mb = float(os.environ.get(CHUNK_ENV, DEFAULT_CHUNK_MB) or 0)
    if budget_mb <= 0:
        return out_rows
    return max(1, min(out_rows, int(budget_mb * (1 << 20)) // max(row_bytes, 1)))


def chunk_rows_plan(
    first: int, count: int, h: int, kh: int, stride: int, pad: int, dilation: int
) -> tuple[int, int, int, int] | None:
    """How output rows [first, first + count) are taken from an input of ``h`` rows padded by
    ``pad`` above and below, without copying the input: (first input row, input rows, the
    symmetric pad im2col adds to that slab, output rows of the slab's im2col to skip), or None
    when im2col's symmetric padding cannot line up (then the input is padded explicitly)."""
    low = first * stride - pad
    high = low + (count - 1) * stride + dilation * (kh - 1)
    missing_top, missing_bottom = max(0, -low), max(0, high - (h - 1))
    extra = max(missing_top, missing_bottom)
    if (extra - missing_top) % stride:
        return None
    start, height = max(low, 0), min(high, h - 1) - max(low, 0) + 1
    skip = (extra - missing_top) // stride
    if height < 1 or (height + 2 * extra - dilation * (kh - 1) - 1) // stride + 1 < skip + count:
        return None
    return start, height, extra, skip


def chunked_conv2d(
    b: Builder,
    x: Tensor,
    kernel: Tensor,
    rows: int,
    *,
    stride: tuple[int, int],
    pad: tuple[int, int],
    dilation: tuple[int, int],
    out_hw: tuple[int, int],
) -> Tensor:
    """A batch-1 conv whose im2col would be large, ``rows`` output rows at a time: each chunk's
    im2col and product are freed (gallocr reuses their memory) before the next, and each chunk is
    written in place into the output (ggml_set), so the peak is one chunk, not the whole im2col.
    Each chunk reads a slab of input rows in place; im2col pads the slab's edges itself."""
    oc, _, kh, _ = kernel.shape
    oh, ow = out_hw
    chunks = [(first, min(rows, oh - first)) for first in range(0, oh, rows)]
    plans = [chunk_rows_plan(f, n, x.shape[2], kh, stride[0], pad[0], dilation[0]) for f, n in chunks]
    if any(plan is None for plan in plans):  # pad once, then every slab is plain rows
        x = pad_constant(b, x, [0, 0, pad[0], 0], [0, 0, pad[0], 0])
        plans = [chunk_rows_plan(f, n, x.shape[2], kh, stride[0], 0, dilation[0]) for f, n in chunks]
    kernel2 = ops.reshape(b, kernel, (oc, kernel.size // oc))
    out: Tensor | None = None
    for (first, count), plan in zip(chunks, plans, strict=True):
        if plan is None:
            raise Unsupported("Conv: an im2col chunk does not line up with the padded input")
        cols = _slab_cols(b, x, kernel, plan, count, stride=stride, pad_w=pad[1], dilation=dilation, ow=ow)
        part = b.op("ggml_mul_mat", cols.ptr, kernel2.ptr, shape=(oc, count * ow))
        if out is None:  # the first chunk, zero-padded to the whole output
            out = b.op("ggml_pad_ext", part.ptr, 0, (oh - count) * ow, 0, 0, 0, 0, 0, 0, shape=(oc, oh * ow))
        else:
            row = oh * ow * 4
            out = b.op(
                "ggml_set_inplace", out.ptr, part.ptr, row, row * oc, row * oc, first * ow * 4, shape=(oc, oh * ow)
            )
    if out is None:
        raise Unsupported("Conv: no output rows")
    return ops.reshape(b, out, (1, oc, oh, ow))


def _slab_cols(
    b: Builder,
    x: Tensor,
    kernel: Tensor,
    plan: tuple[int, int, int, int],
    count: int,
    *,
    stride: tuple[int, int],
    pad_w: int,
    dilation: tuple[int, int],
    ow: int,
) -> Tensor:
    """The im2col rows [count * ow, C*KH*KW] of one chunk, from a view of input rows."""
    _, c, h, w = x.shape
    _, _, kh, kw = kernel.shape
    start, height, extra, skip = plan
    k = c * kh * kw
    # rows [start, start + height) of every channel: im2col reads rows with the input's width
    # and steps channels by nb[2], so the view needs no copy
    slab = b.op(
        "ggml_view_4d", x.ptr, w, height, c, 1, w * 4, h * w * 4, c * h * w * 4, start * w * 4,
        shape=(1, c, height, w),
    )  # fmt: skip
    col_type = L.GGML_TYPE_F16 if kernel.ggml_type == L.GGML_TYPE_F16 else L.GGML_TYPE_F32
    made = (height + 2 * extra - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    spd = (stride[1], stride[0], pad_w, extra, dilation[1], dilation[0])
    cols = b.op("ggml_im2col", kernel.ptr, slab.ptr, *spd, True, col_type, shape=(1, made, ow, k))
    if not b.supported(cols):  # a GPU's im2col reads contiguous operands only: copy the slab
        slab = ops.cont(b, slab)
        cols = b.op("ggml_im2col", kernel.ptr, slab.ptr, *spd, True, col_type, shape=(1, made, ow, k))
    cols2 = ops.reshape(b, cols, (made * ow, k))
    if made == count:
        return cols2
    # the rows the slab's own padding added: a contiguous run of whole rows, skipped by a view
    size = 2 if col_type == L.GGML_TYPE_F16 else 4
    row = k * size
    return b.op(
        "ggml_view_4d", cols2.ptr, k, count * ow, 1, 1, row, row * count * ow, row * count * ow, skip * ow * row,
        shape=(count * ow, k),
    )  # fmt: skip


def convolution(
    b: Builder,
    x: Tensor,
    kernel_of_group: list[Tensor],
    bias: Tensor | None,
    *,
    strides: list[int],
    dilations: list[int],
    before: list[int],
    after: list[int],
    groups_in_kernel: int = 1,
) -> Tensor:
    """A 1-D or 2-D grouped convolution with asymmetric padding (padded explicitly): one
    kernel per group, or one kernel holding ``groups_in_kernel`` groups."""
    one_d = x.rank == 3
    if one_d:
        x = ops.reshape(b, x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        strides, dilations, before, after = [1, *strides], [1, *dilations], [0, *before], [0, *after]
    if before != after or min(before, default=0) < 0:
        x = pad_constant(b, x, [0, 0, *before], [0, 0, *after])
        before = after = [0, 0]
    groups = len(kernel_of_group)
    group_in = x.shape[1] // groups
    outputs = []
    for g, group_kernel in enumerate(kernel_of_group):
        kernel, part = group_kernel, x
        if groups > 1:
            part = ops.slice_view(b, x, [0, g * group_in, 0, 0], [x.shape[0], group_in, *x.shape[2:]], [1, 1, 1, 1])
        if one_d:
            kernel = ops.reshape(b, kernel, (kernel.shape[0], kernel.shape[1], 1, kernel.shape[2]))
        stride, pad, dilation = (strides[0], strides[1]), (before[0], before[1]), (dilations[0], dilations[1])
        if groups_in_kernel > 1:
            outputs.append(
                many_group_conv2d(b, part, kernel, groups_in_kernel, stride=stride, pad=pad, dilation=dilation)
            )
        else:
            outputs.append(conv2d(b, part, kernel, stride=stride, pad=pad, dilation=dilation))
    y = outputs[0] if groups == 1 else ops.concat(b, outputs, 1)
    if bias is not None:
        y = ops.binary(b, "ggml_add", y, ops.reshape(b, bias, (1, bias.size, 1, 1)))
    if one_d:
        y = ops.reshape(b, y, (y.shape[0], y.shape[1], y.shape[3]))
    return y


def _runtime_group_kernels(b: Builder, node: Node, kernel: Tensor, groups: int, reorders: bool) -> list[Tensor]:
    if reorders:
        # the kernel must be flipped at compile time: a graph input there becomes part of
        # the signature (NeedsValue); a computed kernel is unsupported
        b.const(node, 1, "kernel")
    ops.require_float(kernel, what=node.op)
    if groups == 1:
        return [kernel]
    per = kernel.shape[0] // groups
    starts = [[g * per, 0, 0, 0][: kernel.rank] for g in range(groups)]
    return [ops.slice_view(b, kernel, s, [per, *kernel.shape[1:]], [1] * kernel.rank) for s in starts]


def group_kernels(
    b: Builder, node: Node, groups: int, transform: WeightTransform, reorders: bool = False
) -> list[Tensor]:
    """The kernel (input 1) of each group; a constant kernel is ``transform``ed at compile time
    (and again on refit). ``reorders``: the transform is needed even for a runtime kernel."""
    # q8_0: conv kernels stay F16 (see the module docstring)
    half = b.precision in ("fp16", "q8_0")
    kernel = node.value(1)
    if isinstance(kernel, Tensor):  # a runtime kernel (used as is: no transform possible)
        return _runtime_group_kernels(b, node, kernel, groups, reorders)
    if groups == 1:
        return [b.tensor(node, 1, transform=transform, key=f"{node.op}/1", half=half)]
    if groups > MAX_GROUPS:
        raise Unsupported(f"Conv with {groups} groups: at most {MAX_GROUPS} are lowered")
    kernels = []
    for g in range(groups):

        def pick(w: np.ndarray, g: int = g) -> np.ndarray:
            full = transform(w)
            per = full.shape[0] // groups
            return np.ascontiguousarray(full[g * per : (g + 1) * per])

        def group_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
            full = transform.out_shape(shape)
            return (full[0] // groups, *full[1:])

        group = WeightTransform(pick, group_shape)
        kernels.append(b.tensor(node, 1, transform=group, key=f"{node.op}/{groups}/g{g}", half=half))
    return kernels


AS_FLOAT32 = WeightTransform(lambda w: np.asarray(w, dtype=np.float32), lambda shape: shape)


@converter("Conv", since_version=1, check=check_conv)
def convert_conv(b: Builder, node: Node) -> list[Value]:
    return [conv_of(b, node, b.tensor(node, 0))]


def conv_of(b: Builder, node: Node, x: Tensor) -> Tensor:
    """The Conv ``node`` (kernel: input 1, bias: input 2) applied to ``x``."""
    ops.require_float(x, what="Conv")
    if x.rank not in (3, 4):
        raise Unsupported(f"Conv on a rank-{x.rank} input: only 1-D and 2-D convs are lowered")
    weight = node.value(1)
    spatial = x.rank - 2
    kernel = [int(k) for k in (node.attr("kernel_shape") or weight.shape[2:])]
    strides = [int(s) for s in (node.attr("strides") or [1] * spatial)]
    dilations = [int(d) for d in (node.attr("dilations") or [1] * spatial)]
    groups = int(node.attr("group", 1))
    before, after = spatial_pads(node, list(x.shape[2:]), kernel, strides, dilations)
    if x.shape[1] % groups or weight.shape[0] % groups:
        raise Unsupported(f"Conv: {x.shape[1]} channels do not split into {groups} groups")
    depthwise = 1 < groups == x.shape[1] == weight.shape[0]
    in_kernel = groups if groups > MAX_GROUPS or depthwise else 1
    kernels = group_kernels(b, node, groups // in_kernel, AS_FLOAT32)
    bias = b.tensor(node, 2) if node.has(2) else None
    return convolution(
        b, x, kernels, bias, strides=strides, dilations=dilations, before=before, after=after,
        groups_in_kernel=in_kernel,
    )  # fmt: skip
