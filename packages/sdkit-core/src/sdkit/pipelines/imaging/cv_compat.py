"""OpenCV's image operations that face restoration depends on, reproduced in numpy.

A1111 restores faces through facexlib, which aligns, warps and pastes with OpenCV. sdkit carries
no OpenCV; these functions compute what the OpenCV calls facexlib makes compute (OpenCV 5.0's
CPU code paths), so that a face lands on the same pixels:

- ``warp_affine``: ``cv2.warpAffine`` with bilinear interpolation and a constant border. For
  uint8 and float32 images OpenCV 5 maps each output pixel through the inverted matrix in float32
  (``x * M0 + (y * M1 + M2)`` fused, the row term rounded to float32), interpolates in float32
  with fused multiply-adds and rounds half to even; for float64 images it keeps the older
  fixed-point mapping (source coordinates rounded to 1/32 pixel, weights the products of those
  32nds, sums in float64).
- ``invert_affine``: ``cv2.invertAffineTransform`` (the same operation order, so a matrix
  inverted twice is what OpenCV gets).
- ``resize_lanczos4``: ``cv2.resize(..., INTER_LANCZOS4)`` on uint8 (8 taps, OpenCV's
  coefficients rounded to 1/2048, edge pixels repeated, 22-bit fixed-point rounding).
- ``resize_linear``: ``cv2.resize(...)`` with its default ``INTER_LINEAR`` (2 taps at
  ``(d + 0.5) * scale - 0.5``, edges clamped): uint8 with OpenCV's 1/2048 weights and its SIMD
  vertical pass (each row shifted right by 4, multiplied by its weight, the top 16 bits kept,
  then ``(sum + 2) >> 2``; within 1 level of OpenCV 5.0, on 0.3% of values at 64 -> 512 px, the
  edge rows), float64 with float32 weights summed in float64 (within 1e-16). facexlib uses it
  when its face size is not 512 (the restored face up to 512 for ParseNet, the mask back).
- ``gaussian_blur``: ``cv2.GaussianBlur`` (OpenCV's kernel from size and sigma, separable, the
  border reflected without repeating the edge: ``BORDER_REFLECT_101``).
- ``erode``: ``cv2.erode`` with a square kernel of ones (anchor at ``k // 2``, outside ignored).

``fixtures/faces/pipeline/make_pipeline_goldens.py`` holds each against cv2 and states what it
measured (``tests/pipelines/test_faces.py`` checks the committed goldens).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError

Affine = NDArray[np.float64]  # (2, 3)
RESIZE_COEF_SCALE = 2048  # OpenCV's INTER_RESIZE_COEF_SCALE (11 bits)


def invert_affine(matrix: Affine) -> Affine:
    """``cv2.invertAffineTransform``: the inverse of a 2x3 affine matrix (zeros if singular)."""
    m = np.asarray(matrix, dtype=np.float64).reshape(6)
    det = m[0] * m[4] - m[1] * m[3]
    d = 1.0 / det if det != 0 else 0.0
    a11, a12, a21, a22 = m[4] * d, -m[1] * d, -m[3] * d, m[0] * d
    b1 = -a11 * m[2] - a12 * m[5]
    b2 = -a21 * m[2] - a22 * m[5]
    return np.array([[a11, a12, b1], [a21, a22, b2]], dtype=np.float64)


def _warp_inverse(matrix: Affine) -> NDArray[np.float64]:
    """The destination -> source map ``cv2.warpAffine`` computes from a forward matrix (its
    own operation order, which differs from ``invertAffineTransform``'s in the last bits)."""
    m = np.asarray(matrix, dtype=np.float64).reshape(6).copy()
    det = m[0] * m[4] - m[1] * m[3]
    d = 1.0 / det if det != 0 else 0.0
    a11, a22 = m[4] * d, m[0] * d
    m[0], m[1], m[3], m[4] = a11, m[1] * -d, m[3] * -d, a22
    b1 = -m[0] * m[2] - m[1] * m[5]
    b2 = -m[3] * m[2] - m[4] * m[5]
    m[2], m[5] = b1, b2
    return np.asarray(m, dtype=np.float64)


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> NDArray[np.float32]:
    """``a * b + c`` rounded once to float32 (a float32 product is exact in float64)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def _gather(image: np.ndarray, border: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``image[rows, cols]``, ``border`` where that falls outside the image."""
    height, width = image.shape[:2]
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    values = image[np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1)]
    if image.ndim == 3:
        inside = inside[..., None]
    return np.where(inside, values, border)


def _border(image: np.ndarray, value: float | tuple[float, ...], dtype: type) -> np.ndarray:
    channels = image.shape[2] if image.ndim == 3 else 1
    values = tuple(value) if isinstance(value, tuple) else (float(value),) * channels
    if len(values) != channels:
        raise InputError(f"border value {values} for an image of {channels} channels")
    return np.asarray(values if image.ndim == 3 else values[0], dtype=dtype)


Region = tuple[int, int, int, int]  # x0, y0, x1, y1 of the output, in its own pixels


def _warp_float32(image: np.ndarray, inverse: np.ndarray, region: Region, border: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = region
    y = np.arange(y0, y1, dtype=np.float64)[:, None]
    x = np.arange(x0, x1, dtype=np.float32)[None, :]
    row_x = (y * inverse[1] + inverse[2]).astype(np.float32)
    row_y = (y * inverse[4] + inverse[5]).astype(np.float32)
    src_x = _fma32(np.float32(inverse[0]), x, row_x)
    src_y = _fma32(np.float32(inverse[3]), x, row_y)
    ix, iy = np.floor(src_x).astype(np.int64), np.floor(src_y).astype(np.int64)
    alpha, beta = src_x - ix.astype(np.float32), src_y - iy.astype(np.float32)
    if image.ndim == 3:
        alpha, beta = alpha[..., None], beta[..., None]
    src = image.astype(np.float32)
    p00, p01, p10, p11 = (_gather(src, border, iy + dy, ix + dx) for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)))
    top = _fma32(alpha, p01 - p00, p00)
    bottom = _fma32(alpha, p11 - p10, p10)
    out = _fma32(beta, bottom - top, top)
    if image.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out


def _warp_float64(image: np.ndarray, inverse: np.ndarray, region: Region, border: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = region
    x, y = np.arange(x0, x1, dtype=np.float64), np.arange(y0, y1, dtype=np.float64)
    ab_scale, round_delta = 1024, 16  # AB_BITS 10, INTER_BITS 5
    x_delta = np.rint(inverse[0] * x * ab_scale).astype(np.int64)
    y_delta = np.rint(inverse[3] * x * ab_scale).astype(np.int64)
    row_x = np.rint((inverse[1] * y + inverse[2]) * ab_scale).astype(np.int64) + round_delta
    row_y = np.rint((inverse[4] * y + inverse[5]) * ab_scale).astype(np.int64) + round_delta
    fixed_x = (row_x[:, None] + x_delta[None]) >> 5
    fixed_y = (row_y[:, None] + y_delta[None]) >> 5
    ix, iy = fixed_x >> 5, fixed_y >> 5
    fx = (fixed_x & 31).astype(np.float32) / np.float32(32)
    fy = (fixed_y & 31).astype(np.float32) / np.float32(32)
    wx, wy = (np.float32(1) - fx, fx), (np.float32(1) - fy, fy)
    out = np.zeros((y1 - y0, x1 - x0, *image.shape[2:]), dtype=np.float64)
    for dy in (0, 1):
        for dx in (0, 1):
            weight = (wy[dy] * wx[dx]).astype(np.float64)
            out += _gather(image, border, iy + dy, ix + dx) * (weight[..., None] if image.ndim == 3 else weight)
    return out


def warp_affine(
    image: np.ndarray,
    matrix: Affine,
    size: tuple[int, int],
    border_value: float | tuple[float, ...] = 0.0,
    region: Region | None = None,
) -> np.ndarray:
    """``cv2.warpAffine(image, matrix, size, flags=INTER_LINEAR, borderMode=BORDER_CONSTANT,
    borderValue=border_value)``: ``size`` is (width, height); uint8, float32 or float64 images,
    (H, W) or (H, W, C); the result has the image's dtype. ``region`` (x0, y0, x1, y1): only that
    block of the output, each pixel computed as in the whole one."""
    image = np.asarray(image)
    if image.dtype not in (np.uint8, np.float32, np.float64) or image.ndim not in (2, 3):
        raise InputError(f"warp_affine takes (H, W[, C]) uint8/float32/float64 images, got {image.dtype} {image.shape}")
    block = (0, 0, *size) if region is None else region
    inverse = _warp_inverse(matrix)
    if image.dtype == np.float64:
        return _warp_float64(image, inverse, block, _border(image, border_value, np.float64))
    return _warp_float32(image, inverse, block, _border(image, border_value, np.float32))


def _lanczos4_coefficients(fraction: np.ndarray) -> NDArray[np.float32]:
    """OpenCV's ``interpolateLanczos4``: 8 float32 weights per fraction, normalised in float32."""
    s45 = 0.70710678118654752440084436210485
    cs = np.array([[1, 0], [-s45, -s45], [0, 1], [s45, -s45], [-1, 0], [s45, s45], [0, -1], [-s45, s45]])
    x = np.asarray(fraction, dtype=np.float32).astype(np.float64)[:, None]
    y0 = -(x + 3) * math.pi * 0.25
    s0, c0 = np.sin(y0), np.cos(y0)
    y = -(x + 3 - np.arange(8)[None, :]) * math.pi * 0.25
    with np.errstate(divide="ignore", invalid="ignore"):
        coeffs = ((cs[:, 0][None] * s0 + cs[:, 1][None] * c0) / (y * y)).astype(np.float32)
    total = np.zeros(len(coeffs), dtype=np.float32)
    for k in range(8):  # OpenCV sums in float32, in order
        total = (total + coeffs[:, k]).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        coeffs = (coeffs * (np.float32(1) / total)[:, None]).astype(np.float32)
    exact = np.asarray(fraction, dtype=np.float32) < np.finfo(np.float32).eps
    coeffs[exact] = np.array([0, 0, 0, 1, 0, 0, 0, 0], dtype=np.float32)
    return np.asarray(coeffs, dtype=np.float32)


def _lanczos4_taps(src: int, dst: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per output index: the 8 source indices (edges repeated) and their 1/2048 weights."""
    scale = 1.0 / (dst / src)
    pos = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    start = np.floor(pos).astype(np.int64)
    fraction = (pos - start.astype(np.float32)).astype(np.float32)
    weights = np.clip(np.rint(_lanczos4_coefficients(fraction).astype(np.float64) * RESIZE_COEF_SCALE), -32768, 32767)
    index = np.clip(start[:, None] - 3 + np.arange(8)[None, :], 0, src - 1)
    return index, weights.astype(np.int64)


def resize_lanczos4(image: NDArray[np.uint8], size: tuple[int, int]) -> NDArray[np.uint8]:
    """``cv2.resize(image, size, interpolation=cv2.INTER_LANCZOS4)`` for a uint8 (H, W[, C])
    image; ``size`` is (width, height). The same size is a copy, as in OpenCV."""
    image = np.asarray(image)
    width, height = size
    if image.dtype != np.uint8 or width < 1 or height < 1:
        raise InputError(f"resize_lanczos4 takes uint8 images and a positive size, got {image.dtype} {size}")
    if (height, width) == image.shape[:2]:
        return np.array(image, dtype=np.uint8)
    cols, col_w = _lanczos4_taps(image.shape[1], width)
    rows, row_w = _lanczos4_taps(image.shape[0], height)
    src = image.astype(np.int64).reshape(*image.shape[:2], -1)
    horizontal = np.zeros((src.shape[0], width, src.shape[2]), dtype=np.int64)
    for k in range(8):
        horizontal += src[:, cols[:, k]] * col_w[None, :, k, None]
    vertical = np.zeros((height, width, src.shape[2]), dtype=np.int64)
    for k in range(8):
        vertical += horizontal[rows[:, k]] * row_w[:, k, None, None]
    shift = 2 * 11  # INTER_RESIZE_COEF_BITS * 2
    out = np.clip((vertical + (1 << (shift - 1))) >> shift, 0, 255).astype(np.uint8)
    return np.asarray(out.reshape(height, width, *image.shape[2:]), dtype=np.uint8)


def _linear_taps(src: int, dst: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Per output index: the first of 2 source indices and the float32 weight of the second
    (OpenCV's ``interpolateLinear``; outside the image the edge pixel alone)."""
    pos = ((np.arange(dst) + 0.5) * (src / dst) - 0.5).astype(np.float32)
    start = np.floor(pos).astype(np.int64)
    fraction = (pos - start.astype(np.float32)).astype(np.float32)
    low, high = start < 0, start >= src - 1
    fraction[low | high] = 0
    start[low] = 0
    start[high] = src - 1
    return start, fraction


def resize_linear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``cv2.resize(image, size)`` (``INTER_LINEAR``) for a uint8 or float64 (H, W[, C]) image;
    ``size`` is (width, height); the same size is a copy."""
    image = np.asarray(image)
    width, height = size
    if image.dtype not in (np.uint8, np.float64) or width < 1 or height < 1 or image.ndim not in (2, 3):
        raise InputError(f"resize_linear takes uint8/float64 images and a positive size, got {image.dtype} {size}")
    if (height, width) == image.shape[:2]:
        return np.array(image)
    cols, col_f = _linear_taps(image.shape[1], width)
    rows, row_f = _linear_taps(image.shape[0], height)
    src = image.reshape(*image.shape[:2], -1)
    right, below = np.minimum(cols + 1, image.shape[1] - 1), np.minimum(rows + 1, image.shape[0] - 1)
    if image.dtype == np.uint8:
        col_b = np.clip(np.rint((1 - col_f.astype(np.float64)) * RESIZE_COEF_SCALE), -32768, 32767).astype(np.int64)
        row_b = np.clip(np.rint((1 - row_f.astype(np.float64)) * RESIZE_COEF_SCALE), -32768, 32767).astype(np.int64)
        wide = src.astype(np.int64)
        across = wide[:, cols] * col_b[None, :, None] + wide[:, right] * (RESIZE_COEF_SCALE - col_b)[None, :, None]
        # OpenCV's SIMD vertical pass: rows >> 4, (row * beta) >> 16 per tap, (sum + 2) >> 2
        top, bottom = (
            (across[rows] >> 4) * row_b[:, None, None],
            (across[below] >> 4) * (RESIZE_COEF_SCALE - row_b)[:, None, None],
        )
        out: np.ndarray = np.clip(((top >> 16) + (bottom >> 16) + 2) >> 2, 0, 255).astype(np.uint8)
    else:
        a0, a1 = (1 - col_f).astype(np.float64), col_f.astype(np.float64)
        b0, b1 = (1 - row_f).astype(np.float64), row_f.astype(np.float64)
        across = src[:, cols] * a0[None, :, None] + src[:, right] * a1[None, :, None]
        out = across[rows] * b0[:, None, None] + across[below] * b1[:, None, None]
    return np.asarray(out.reshape(height, width, *image.shape[2:]))


_SMALL_GAUSSIAN = {
    1: (1.0,),
    3: (0.25, 0.5, 0.25),
    5: (0.0625, 0.25, 0.375, 0.25, 0.0625),
    7: (0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125),
    9: tuple(v / 256 for v in (4, 13, 30, 51, 60, 51, 30, 13, 4)),
}


def gaussian_kernel(size: int, sigma: float) -> NDArray[np.float64]:
    """``cv2.getGaussianKernel(size, sigma)`` for odd sizes: OpenCV's fixed table for sizes up to
    9 without a sigma, else its bit-exact construction (exponentials at doubled offsets, summed in
    order, normalised by one reciprocal; the centre is ``1 / sum``)."""
    if sigma <= 0 and size in _SMALL_GAUSSIAN:
        return np.asarray(_SMALL_GAUSSIAN[size], dtype=np.float64)
    sigma = float(sigma) if sigma > 0 else size * 0.15 + 0.35
    scale = -0.125 / (sigma * sigma)
    half = (size - 1) // 2
    values = [math.exp(float(x * x) * scale) for x in range(1 - size, 0, 2)][:half]
    total = 0.0
    for v in values:
        total += v
    total = total * 2 + 1.0
    inverse = 1.0 / total
    side = [v * inverse for v in values]
    return np.array([*side, inverse, *side[::-1]], dtype=np.float64)


def _reflect101(length: int, pad: int) -> NDArray[np.int64]:
    index = np.arange(-pad, length + pad)
    if length == 1:
        return np.zeros_like(index)
    period = 2 * (length - 1)
    index = np.abs(index) % period
    return np.where(index >= length, period - index, index)


def gaussian_blur(image: np.ndarray, size: int, sigma: float) -> np.ndarray:
    """``cv2.GaussianBlur(image, (size, size), sigma)`` on a float (H, W) image, separable,
    ``BORDER_REFLECT_101``; float64 sums, the image's dtype back."""
    image = np.asarray(image)
    if size % 2 != 1 or image.ndim != 2 or image.dtype not in (np.float32, np.float64):
        raise InputError(f"gaussian_blur takes an odd size and a float (H, W) image, got {size}, {image.shape}")
    kernel = gaussian_kernel(size, sigma)
    if image.dtype == np.float32:
        kernel = kernel.astype(np.float32).astype(np.float64)
    pad = size // 2
    height, width = image.shape
    rows = image.astype(np.float64)[:, _reflect101(width, pad)]
    across = kernel[0] * rows[:, :width]  # OpenCV's row filter: taps summed in order
    for k in range(1, size):
        across = across + kernel[k] * rows[:, k : k + width]
    if image.dtype == np.float32:
        across = across.astype(np.float32).astype(np.float64)
    cols = across[_reflect101(height, pad)]
    out = kernel[pad] * cols[pad : pad + height]  # its symmetric column filter: pairs first
    for k in range(1, pad + 1):
        out = out + kernel[pad + k] * (cols[pad + k : pad + k + height] + cols[pad - k : pad - k + height])
    return np.asarray(out, dtype=image.dtype)


def erode(image: np.ndarray, size: int) -> np.ndarray:
    """``cv2.erode(image, np.ones((size, size), np.uint8))`` on an (H, W) image: the minimum
    over the ``size`` x ``size`` window anchored at ``size // 2`` (an empty kernel: 3 x 3, as
    OpenCV substitutes); pixels outside the image never count."""
    image = np.asarray(image)
    if size <= 0:
        size = 3
    anchor = size // 2
    height, width = image.shape
    padded = np.full((height + size - 1, width + size - 1), np.inf, dtype=np.float64)
    padded[anchor : anchor + height, anchor : anchor + width] = image
    rows = padded[:height].copy()  # a square window of ones is a row minimum, then a column one
    for dy in range(1, size):
        np.minimum(rows, padded[dy : dy + height], out=rows)
    out = rows[:, :width].copy()
    for dx in range(1, size):
        np.minimum(out, rows[:, dx : dx + width], out=out)
    return np.asarray(out, dtype=image.dtype)
