"""Inpainting masks: diffusers' preprocessing, A1111's mask blur and "only masked" crop region.

diffusers (what the goldens of ``fixtures/tiny_xl`` use), ``VaeImageProcessor`` with
``do_binarize`` and then ``torch.nn.functional.interpolate(mode="nearest")``:

- ``binarize_mask``: a uint8 grey mask / 255, then 0 below 0.5 and 1 from 0.5 up (128 -> 1,
  127 -> 0). 1 means repaint.
- ``latent_mask``: latent pixel (i, j) takes mask pixel (floor(i * H / h), floor(j * W / w)),
  PyTorch's legacy "nearest" (for the VAE's factor f: pixel (i f, j f)); no blur or pooling.

A1111 (``modules/processing.py``, ``modules/masking.py``), applied before the above:

- ``blur_mask`` (``mask_blur``, default 4): ``cv2.GaussianBlur`` along x, then along y, with sigma
  ``blur`` and ``2 * int(2.5 * blur + 0.5) + 1`` taps, reproduced bit for bit in numpy: OpenCV's
  uint8 path uses the kernel ``exp(-(i - c)^2 / (2 sigma^2))`` normalised and quantised to 1/256
  (rounded from the outside in, each rounding error carried to the next tap, the centre tap taking
  the rest so the taps sum to 256), integer sums, ``(sum + 128) >> 8``, and the border reflected
  without repeating the edge pixel (BORDER_REFLECT_101).
- ``crop_region`` / ``expand_crop_region`` ("inpaint only masked", ``inpaint_full_res_padding``):
  the bounding box of the mask's nonzero pixels grown by the padding and clamped to the image,
  then widened (or heightened) about its centre to the generation size's aspect ratio, shifted
  back inside the image. Worked example: a mask drawn in x 100..228, y 50..82 of a 512 x 512 image
  (box (100, 50, 228, 82), 128 x 32) processed at 512 x 512 becomes (100, 2, 228, 130): height
  128, 48 rows added above and below.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError

F32 = NDArray[np.float32]


def _grey(mask: Any) -> NDArray[np.uint8]:
    array = np.asarray(mask)
    if array.dtype != np.uint8 or array.ndim != 2 or 0 in array.shape:
        raise InputError(f"a mask must be a non-empty uint8 [H, W] array, got {array.dtype} {list(array.shape)}")
    return array


def open_mask(mask: Any) -> NDArray[np.uint8]:
    """An inpainting mask as a uint8 [H, W] array, 255 = repaint: a PIL image or an image file
    (converted to grey, ``"L"``, as diffusers does), a uint8 [H, W] / [H, W, 3 or 4] array or a
    bool [H, W] array (True = repaint)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(mask, (str, os.PathLike)):
        path = Path(mask)
        if not path.is_file():
            raise InputError(f"mask not found: {path}")
        try:
            with Image.open(path) as opened:
                return _grey(np.array(opened.convert("L"), dtype=np.uint8))
        except (UnidentifiedImageError, OSError) as exc:
            raise InputError(f"mask {path} is not a readable image: {exc}") from None
    if isinstance(mask, Image.Image):
        return _grey(np.array(mask.convert("L"), dtype=np.uint8))
    if isinstance(mask, np.ndarray):
        if mask.dtype == np.bool_ and mask.ndim == 2:
            return _grey(np.where(mask, 255, 0).astype(np.uint8))
        if mask.dtype == np.uint8 and mask.ndim == 3 and mask.shape[2] in (3, 4):
            return _grey(np.array(Image.fromarray(mask).convert("L"), dtype=np.uint8))
        copied: NDArray[np.uint8] = _grey(mask).copy()
        return copied
    raise InputError(f"the mask must be a PIL image, a uint8 or bool array or a path, not {type(mask).__name__}")


def binarize_mask(mask: Any) -> F32:
    """diffusers' mask preprocessing: [H, W] uint8 -> float32 0/1 (>= 0.5 after / 255 is 1)."""
    values = _grey(mask).astype(np.float32) / np.float32(255.0)
    return np.asarray(values >= 0.5, dtype=np.float32)


def latent_mask(mask: F32, height: int, width: int) -> F32:
    """PyTorch's ``interpolate(mode="nearest")`` of a [H, W] mask to [height, width]."""
    source = np.asarray(mask, dtype=np.float32)
    if source.ndim != 2 or height < 1 or width < 1:
        raise InputError(f"latent_mask needs a [H, W] mask and a positive size, got {list(source.shape)}")
    rows = np.minimum(np.floor(np.arange(height) * (source.shape[0] / height)).astype(np.int64), source.shape[0] - 1)
    cols = np.minimum(np.floor(np.arange(width) * (source.shape[1] / width)).astype(np.int64), source.shape[1] - 1)
    return np.ascontiguousarray(source[np.ix_(rows, cols)])


def _gaussian_kernel(sigma: float) -> NDArray[np.float64]:
    size = 2 * int(2.5 * sigma + 0.5) + 1
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2
    kernel = np.exp(-(x * x) / (2 * sigma * sigma))
    return np.asarray(kernel / kernel.sum(), dtype=np.float64)


def _fixed_point_kernel(sigma: float) -> NDArray[np.int64]:
    """OpenCV's 8-bit Gaussian kernel: coefficients in 1/256, rounded from the outside in with the
    rounding error carried inward, the centre taking what makes the sum exactly 256."""
    kernel = _gaussian_kernel(sigma)
    size, half = len(kernel), len(kernel) // 2
    fixed = np.zeros(size, dtype=np.int64)
    carried = 0.0
    for i in range(half):
        wanted = kernel[i] * 256.0 + carried
        fixed[i] = fixed[size - 1 - i] = int(np.rint(wanted))
        carried = wanted - float(fixed[i])
    fixed[half] = 256 - 2 * int(fixed[:half].sum())
    return fixed


def _reflect101(count: int, half: int) -> NDArray[np.int64]:
    """Source indices of ``range(-half, count + half)`` under OpenCV's BORDER_REFLECT_101."""
    index = np.arange(-half, count + half)
    if count == 1:
        return np.zeros_like(index)
    period = 2 * (count - 1)
    folded = np.mod(index, period)
    return np.where(folded >= count, period - folded, folded)


def _blur_axis(image: NDArray[np.uint8], sigma: float, axis: int) -> NDArray[np.uint8]:
    """One ``cv2.GaussianBlur`` pass on uint8 along ``axis``: integer taps, rounded half up."""
    kernel = _fixed_point_kernel(sigma)
    count, half = image.shape[axis], len(kernel) // 2
    padded = np.take(image.astype(np.int64), _reflect101(count, half), axis=axis)
    total = np.zeros(image.shape, dtype=np.int64)
    for i, weight in enumerate(kernel):
        total += int(weight) * np.take(padded, np.arange(i, i + count), axis=axis)
    return np.asarray(np.clip((total + 128) >> 8, 0, 255), dtype=np.uint8)


def blur_mask(mask: Any, blur_x: float = 4.0, blur_y: float | None = None) -> NDArray[np.uint8]:
    """A1111's ``mask_blur``: Gaussian blur along x (sigma ``blur_x``) then y (``blur_y``, default
    the same), each skipped at 0, on the uint8 mask; bit for bit what OpenCV computes."""
    image = _grey(mask)
    blur_y = blur_x if blur_y is None else blur_y
    if blur_x < 0 or blur_y < 0 or not (math.isfinite(blur_x) and math.isfinite(blur_y)):
        raise InputError(f"mask blur must be >= 0, got {blur_x}, {blur_y}")
    if blur_x > 0:
        image = _blur_axis(image, blur_x, axis=1)
    if blur_y > 0:
        image = _blur_axis(image, blur_y, axis=0)
    return np.ascontiguousarray(image)


def crop_region(mask: Any, padding: int = 0) -> tuple[int, int, int, int] | None:
    """(x1, y1, x2, y2), exclusive ends: the nonzero pixels' bounding box grown by ``padding`` and
    clamped to the mask; None for an empty mask."""
    grey = _grey(mask)
    ys, xs = np.nonzero(grey)
    if ys.size == 0:
        return None
    height, width = grey.shape
    return (
        max(int(xs.min()) - padding, 0),
        max(int(ys.min()) - padding, 0),
        min(int(xs.max()) + 1 + padding, width),
        min(int(ys.max()) + 1 + padding, height),
    )


def _expand(lo: int, hi: int, grow: int, limit: int) -> tuple[int, int]:
    lo -= grow // 2
    hi += grow - grow // 2
    if hi >= limit:
        lo, hi = lo - (hi - limit), limit
    if lo < 0:
        lo, hi = 0, hi - lo
    return lo, min(hi, limit)


def expand_crop_region(
    region: tuple[int, int, int, int],
    processing_width: int,
    processing_height: int,
    image_width: int,
    image_height: int,
) -> tuple[int, int, int, int]:
    """A1111's ``expand_crop_region``: ``region`` grown to the processing size's aspect ratio."""
    x1, y1, x2, y2 = region
    if x2 <= x1 or y2 <= y1 or processing_width < 1 or processing_height < 1:
        raise InputError(f"cannot expand the crop region {region} to {processing_width}x{processing_height}")
    ratio = processing_width / processing_height
    if (x2 - x1) / (y2 - y1) > ratio:
        y1, y2 = _expand(y1, y2, int((x2 - x1) / ratio - (y2 - y1)), image_height)
    else:
        x1, x2 = _expand(x1, x2, int((y2 - y1) * ratio - (x2 - x1)), image_width)
    return x1, y1, x2, y2
