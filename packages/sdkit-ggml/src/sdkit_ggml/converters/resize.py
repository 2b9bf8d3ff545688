"""Resize / Upsample: nearest and (bi)linear on the two innermost axes via ggml_interpolate.

ggml's nearest picks source index floor(i * in / out); a Resize is lowered only when its
ONNX coordinate mapping selects exactly the same pixels (checked at compile time).
Linear maps to ggml bilinear (half_pixel / pytorch_half_pixel) or align_corners.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Tensor, Unsupported, Value, attributes
from sdkit_ggml.converters.table import converter
from sdkit_ggml.runtime import lib as L

NEAREST_TRANSFORMS = ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners", "tf_half_pixel_for_nn")
LINEAR_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners")


def _static_problem(a: dict[str, Any], transform: str) -> str | None:
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r}: nearest and linear are lowered"
    if a.get("antialias", 0):
        return "Resize with antialias"
    if "axes" in a or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize with axes or keep_aspect_ratio_policy"
    if mode == "linear" and transform not in LINEAR_TRANSFORMS:
        return f"Resize linear with coordinate_transformation_mode {transform!r}"
    if mode == "nearest" and transform not in NEAREST_TRANSFORMS:
        return f"Resize coordinate_transformation_mode {transform!r}"
    return None


def check_resize(node: onnx.NodeProto) -> str | None:
    """Resize from opset 11 (coordinate_transformation_mode defaults to half_pixel)."""
    a = attributes(node)
    return _static_problem(a, a.get("coordinate_transformation_mode", "half_pixel"))


def check_legacy_resize(node: onnx.NodeProto) -> str | None:
    """Upsample, and Resize before opset 11: asymmetric coordinates."""
    return _static_problem(attributes(node), "asymmetric")


def _onnx_nearest(in_size: int, out_size: int, scale: float, mode: str, rounding: str) -> np.ndarray:
    i = np.arange(out_size, dtype=np.float64)
    if mode == "asymmetric":
        x = i / scale
    elif mode in ("half_pixel", "pytorch_half_pixel"):
        x = (i + 0.5) / scale - 0.5
        if mode == "pytorch_half_pixel" and out_size == 1:
            x = np.zeros_like(i)
    elif mode == "align_corners":
        x = i * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(i)
    elif mode == "tf_half_pixel_for_nn":
        x = (i + 0.5) / scale
    else:
        raise Unsupported(f"Resize coordinate_transformation_mode {mode!r}")
    if rounding == "floor":
        idx = np.floor(x)
    elif rounding == "ceil":
        idx = np.ceil(x)
    elif rounding == "round_prefer_ceil":
        idx = np.floor(x + 0.5)
    else:  # round_prefer_floor
        idx = np.ceil(x - 0.5)
    return np.clip(idx, 0, in_size - 1).astype(np.int64)


def _ggml_nearest(in_size: int, out_size: int) -> np.ndarray:
    sf = np.float32(out_size) / np.float32(in_size)
    picked: np.ndarray = np.minimum((np.arange(out_size, dtype=np.float32) / sf).astype(np.int64), in_size - 1)
    return picked


def _scales_and_sizes(b: Builder, node: Node) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(scales, sizes) from the attribute (Upsample < 9) or the inputs; an empty one is None."""
    if node.op == "Upsample":
        scales = node.attr("scales") if node.opset < 9 else b.const(node, 1, "scales")
        return np.asarray(scales, dtype=np.float64), None
    if node.opset < 11:
        return np.asarray(b.const(node, 1, "scales"), dtype=np.float64), None
    scales_v = b.const(node, 2, "scales") if node.has(2) else None
    sizes_v = b.const(node, 3, "sizes") if node.has(3) else None
    scales = np.asarray(scales_v, dtype=np.float64) if scales_v is not None and np.asarray(scales_v).size else None
    sizes = np.asarray(sizes_v, dtype=np.int64) if sizes_v is not None and np.asarray(sizes_v).size else None
    return scales, sizes


def _output_shape(b: Builder, node: Node, x: Tensor) -> tuple[tuple[int, ...], np.ndarray]:
    scales, sizes = _scales_and_sizes(b, node)
    if sizes is not None:
        out_shape = tuple(int(s) for s in sizes)
        scales = np.array([o / i for o, i in zip(out_shape, x.shape, strict=True)])
    elif scales is not None:
        out_shape = tuple(int(np.floor(d * s)) for d, s in zip(x.shape, scales, strict=True))
    else:
        raise Unsupported("Resize needs scales or sizes")
    if len(out_shape) != x.rank:
        raise Unsupported("Resize scales/sizes do not match the input rank")
    return out_shape, scales


def _nearest_flags(node: Node, x: Tensor, out_shape: tuple[int, ...], scales: np.ndarray, transform: str) -> int:
    # Upsample's nearest repeats each pixel (floor(i / scale)); Resize rounds by nearest_mode
    rounding = "floor" if node.op == "Upsample" else node.attr("nearest_mode", "round_prefer_floor")
    for axis in range(max(0, x.rank - 2), x.rank):
        want = _onnx_nearest(x.shape[axis], out_shape[axis], float(scales[axis]), transform, rounding)
        if not np.array_equal(want, _ggml_nearest(x.shape[axis], out_shape[axis])):
            raise Unsupported(f"Resize nearest ({transform}, {rounding}) picks other pixels than ggml's nearest")
    return L.GGML_SCALE_MODE_NEAREST


def _linear_flags(x: Tensor, out_shape: tuple[int, ...], scales: np.ndarray, transform: str) -> int:
    exact = all(abs(float(s) - o / i) < 1e-9 for s, o, i in zip(scales, out_shape, x.shape, strict=True))
    if any(o < i for o, i in zip(out_shape, x.shape, strict=True)) or not exact:
        raise Unsupported(
            "Resize linear downsampling or a scale that is not out/in: ggml's bilinear maps coordinates by out/in"
        )
    if transform == "align_corners":
        return L.GGML_SCALE_MODE_BILINEAR | L.GGML_SCALE_FLAG_ALIGN_CORNERS
    return L.GGML_SCALE_MODE_BILINEAR  # half_pixel / pytorch_half_pixel (check_resize)


@converter("Upsample", since_version=7, check=check_legacy_resize)
@converter("Resize", since_version=7, check=check_legacy_resize)
@converter("Resize", since_version=11, check=check_resize)
def convert_resize(b: Builder, node: Node) -> list[Value]:
    x = b.tensor(node, 0)
    ops.require_float(x, what="Resize")
    ops.require_rank(x, 4, "Resize")
    out_shape, scales = _output_shape(b, node, x)
    if out_shape == x.shape:
        return [x]
    if any(o != i for o, i in zip(out_shape[:-2], x.shape[:-2], strict=True)):
        raise Unsupported("Resize of an axis other than the two innermost")
    legacy = node.op == "Upsample" or node.opset < 11
    transform = "asymmetric" if legacy else node.attr("coordinate_transformation_mode", "half_pixel")
    if node.attr("mode", "nearest") == "nearest":
        flags = _nearest_flags(node, x, out_shape, scales, transform)
    else:
        flags = _linear_flags(x, out_shape, scales, transform)
    return [b.op("ggml_interpolate", x.ptr, *ops.ne_of(out_shape), flags, shape=out_shape, dtype=x.dtype)]
