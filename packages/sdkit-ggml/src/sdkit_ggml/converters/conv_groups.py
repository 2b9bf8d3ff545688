"""Grouped 2-D convolutions with any number of groups, in a fixed number of ggml nodes.

Up to ``MAX_GROUPS`` groups, converters/conv.py lowers one conv per group (each may take the
direct kernel or a chunked im2col), except depthwise convs. Beyond that (ShuffleNet), and for
depthwise convs at any group count (MobileNet's, 8-1024 groups):

- depthwise with one kernel per channel (groups == in channels == out channels): ggml's
  GGML_OP_CONV_2D_DW (``ggml_conv_2d_dw_direct``, F32 sums), where the library binds it and the
  device computes it (``Builder.supported``);
- otherwise, batched: the input seen as ``N * groups`` images of ``C / groups`` channels, one
  im2col over all of them, and one mul_mat batched over the groups. Each output is the same
  F32 dot product as a per-group im2col + mul_mat.
"""

from __future__ import annotations

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Tensor, Unsupported
from sdkit_ggml.runtime import lib as L


def _out_size(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def depthwise_conv2d(
    b: Builder, x: Tensor, kernel: Tensor, *, stride: tuple[int, int], pad: tuple[int, int], dilation: tuple[int, int]
) -> Tensor | None:
    """x [N,C,H,W] * kernel [C,1,KH,KW] -> [N,C,OH,OW] through GGML_OP_CONV_2D_DW, or None
    where the library or the device lacks it (the caller then takes the batched lowering)."""
    n, c, h, w = x.shape
    _, per_group, kh, kw = kernel.shape
    if per_group != 1:  # a kernel that does not fit the input (batched_group_conv2d says so)
        return None
    if not b.has_function("ggml_conv_2d_dw_direct") or kernel.ggml_type not in (L.GGML_TYPE_F32, L.GGML_TYPE_F16):
        return None
    oh, ow = _out_size(h, kh, stride[0], pad[0], dilation[0]), _out_size(w, kw, stride[1], pad[1], dilation[1])
    if oh <= 0 or ow <= 0:  # ggml would abort
        raise Unsupported(f"Conv: a {kh}x{kw} kernel does not fit input {h}x{w} (padding {pad})")
    spd = (stride[1], stride[0], pad[1], pad[0], dilation[1], dilation[0])
    y = b.op("ggml_conv_2d_dw_direct", kernel.ptr, x.ptr, *spd, shape=(n, c, oh, ow))
    return y if b.supported(y) else None


def batched_group_conv2d(
    b: Builder,
    x: Tensor,
    kernel: Tensor,
    groups: int,
    *,
    stride: tuple[int, int],
    pad: tuple[int, int],
    dilation: tuple[int, int],
) -> Tensor:
    """x [N,C,H,W] * kernel [OC,C/groups,KH,KW] -> [N,OC,OH,OW], groups batched in one mul_mat."""
    n, c, h, w = x.shape
    oc, ci, kh, kw = kernel.shape
    if ci * groups != c or oc % groups:
        raise Unsupported(f"Conv: {c} channels and {oc} outputs do not split into {groups} groups of {ci}")
    co, k = oc // groups, ci * kh * kw
    oh, ow = _out_size(h, kh, stride[0], pad[0], dilation[0]), _out_size(w, kw, stride[1], pad[1], dilation[1])
    if oh <= 0 or ow <= 0:
        raise Unsupported(f"Conv: a {kh}x{kw} kernel does not fit input {h}x{w} (padding {pad})")
    images = ops.reshape(b, x, (n * groups, ci, h, w))  # channels are contiguous per group
    col_type = L.GGML_TYPE_F16 if kernel.ggml_type == L.GGML_TYPE_F16 else L.GGML_TYPE_F32
    spd = (stride[1], stride[0], pad[1], pad[0], dilation[1], dilation[0])
    cols = b.op("ggml_im2col", kernel.ptr, images.ptr, *spd, True, col_type, shape=(n * groups, oh, ow, k))
    cols = ops.reshape(b, cols, (n, groups, oh * ow, k))
    kernels = ops.reshape(b, kernel, (1, groups, co, k))
    if n == 1:  # mul_mat(cols, kernels) is channels-first already: [1, groups, co, OH*OW]
        product = b.op("ggml_mul_mat", cols.ptr, kernels.ptr, shape=(1, groups, co, oh * ow))
        return ops.reshape(b, product, (1, oc, oh, ow))
    # the kernels broadcast over the batch only as mul_mat's first operand: [N, groups, OH*OW, co]
    product = b.op("ggml_mul_mat", kernels.ptr, cols.ptr, shape=(n, groups, oh * ow, co))
    return ops.reshape(b, ops.transpose(b, product, (0, 1, 3, 2)), (n, oc, oh, ow))


def many_group_conv2d(
    b: Builder,
    x: Tensor,
    kernel: Tensor,
    groups: int,
    *,
    stride: tuple[int, int],
    pad: tuple[int, int],
    dilation: tuple[int, int],
) -> Tensor:
    """A grouped conv (symmetric padding): depthwise kernel where it applies, else batched."""
    if groups == x.shape[1] == kernel.shape[0]:
        y = depthwise_conv2d(b, x, kernel, stride=stride, pad=pad, dilation=dilation)
        if y is not None:
            return y
    return batched_group_conv2d(b, x, kernel, groups, stride=stride, pad=pad, dilation=dilation)
