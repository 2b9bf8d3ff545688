"""ConvTranspose (1-D and 2-D), lowered exactly: zeros inserted between input pixels, then a
stride-1 convolution with the flipped kernel (``conv.convolution``)."""

from __future__ import annotations

import numpy as np

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder, WeightTransform
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value
from sdkit_ggml.converters.conv import check_conv, convolution, group_kernels
from sdkit_ggml.converters.pad import pad_constant
from sdkit_ggml.converters.table import converter


def _insert_zeros(b: Builder, x: Tensor, strides: list[int]) -> Tensor:
    """[N,C,H,W] -> [N,C,(H-1)*sh+1,(W-1)*sw+1] with stride-1 zeros between pixels."""
    n, c, h, w = x.shape
    sh, sw = strides
    up = ops.reshape(b, x, (n * c, h, w))
    if sw > 1:
        up = ops.reshape(b, up, (n * c, h, w, 1))
        up = pad_constant(b, up, [0, 0, 0, 0], [0, 0, 0, sw - 1])
        up = ops.reshape(b, up, (n * c, h, w * sw))
        up = ops.slice_view(b, up, [0, 0, 0], [n * c, h, (w - 1) * sw + 1], [1, 1, 1])
    width = up.shape[-1]
    if sh > 1:
        up = ops.reshape(b, up, (n * c, h, 1, width))
        up = pad_constant(b, up, [0, 0, 0, 0], [0, 0, sh - 1, 0])
        up = ops.reshape(b, up, (n * c, h * sh, width))
        up = ops.slice_view(b, up, [0, 0, 0], [n * c, (h - 1) * sh + 1, width], [1, 1, 1])
    return ops.reshape(b, up, (n, c, up.shape[1], width))


def _flip(groups: int) -> WeightTransform:
    """[Cin, Cout/g, kh, kw] (or [Cin, Cout/g, k]) -> [Cout, Cin/g, kh, kw] with each
    group's kernels spatially flipped: ConvTranspose as a convolution."""

    def flipped(wt: np.ndarray) -> np.ndarray:
        full = np.asarray(wt, dtype=np.float32)
        if full.ndim == 3:
            full = full[:, :, None, :]
        cin, cout_g = full.shape[0], full.shape[1]
        grouped = full.reshape(groups, cin // groups, cout_g, *full.shape[2:])
        grouped = grouped.transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
        return np.ascontiguousarray(grouped.reshape(groups * cout_g, cin // groups, *full.shape[2:]))

    def shape(shape: tuple[int, ...]) -> tuple[int, ...]:
        spatial = (1, shape[2]) if len(shape) == 3 else tuple(shape[2:])
        return (groups * shape[1], shape[0] // groups, *spatial)

    return WeightTransform(flipped, shape)


class _Geometry:
    """Kernel, strides, dilations, output padding and pads of a ConvTranspose, as 2-D."""

    def __init__(self, node: Node, x: Tensor, weight_shape: tuple[int, ...]) -> None:
        one_d = x.rank == 3

        def pair(name: str, default: int) -> list[int]:
            values = [int(v) for v in (node.attr(name) or [default] * (x.rank - 2))]
            return [default, *values] if one_d else values

        kernel = [int(k) for k in (node.attr("kernel_shape") or weight_shape[2:])]
        self.kernel = [1, *kernel] if one_d else kernel
        self.strides, self.dilations, self.out_pad = pair("strides", 1), pair("dilations", 1), pair("output_padding", 0)
        raw_pads = [int(p) for p in (node.attr("pads") or [0] * (2 * (x.rank - 2)))]
        self.pads = [0, raw_pads[0], 0, raw_pads[1]] if one_d else raw_pads
        size = (1, x.shape[2]) if one_d else (x.shape[2], x.shape[3])
        auto_pad = node.attr("auto_pad", "NOTSET")
        if node.attr("output_shape") is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            self._pads_for_output(node, size, one_d, auto_pad)

    def _pads_for_output(self, node: Node, size: tuple[int, int], one_d: bool, auto_pad: str) -> None:
        """pads follow from the requested output size (ONNX ConvTranspose formula)."""
        requested = [int(v) for v in (node.attr("output_shape") or [])]
        wanted = requested[-2:] if requested else [size[0] * self.strides[0], size[1] * self.strides[1]]
        if one_d and requested:
            wanted = [1, requested[-1]]
        for i in range(2):
            total = (
                self.strides[i] * (size[i] - 1)
                + self.out_pad[i]
                + (self.kernel[i] - 1) * self.dilations[i]
                + 1
                - wanted[i]
            )
            small, big = total // 2, total - total // 2
            self.pads[i], self.pads[i + 2] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)

    def conv_pads(self) -> tuple[list[int], list[int]]:
        """(before, after) pads of the equivalent stride-1 convolution."""
        k, d, p = self.kernel, self.dilations, self.pads
        before = [d[i] * (k[i] - 1) - p[i] for i in range(2)]
        after = [d[i] * (k[i] - 1) - p[i + 2] + self.out_pad[i] for i in range(2)]
        return before, after


@converter("ConvTranspose", since_version=1, check=check_conv)
def convert_conv_transpose(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    ops.require_float(x, what="ConvTranspose")
    if x.rank not in (3, 4):
        raise Unsupported("ConvTranspose: only 1-D and 2-D are lowered")
    one_d = x.rank == 3  # lowered as 2-D over a height of 1
    # the kernel is flipped at compile time: a graph input there specialises the signature
    weight = b.const(node, 1, "kernel") if isinstance(node.value(1), Tensor) else node.value(1)
    groups = int(node.attr("group", 1))
    geometry = _Geometry(node, x, tuple(weight.shape))
    if one_d:
        x = ops.reshape(b, x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    up = _insert_zeros(b, x, geometry.strides)
    before, after = geometry.conv_pads()
    kernels = group_kernels(b, node, groups, _flip(groups), reorders=True)
    bias = b.tensor(node, 2) if node.has(2) else None
    y = convolution(b, up, kernels, bias, strides=[1, 1], dilations=geometry.dilations, before=before, after=after)
    return [ops.reshape(b, y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]
