"""ControlNet preprocessors that need no model, as A1111's ControlNet extension (sd-webui-controlnet,
``annotator/`` and ``scripts/processor.py``) computes them.

Every function takes and returns a uint8 RGB image ``[H, W, 3]`` (a grey ``[H, W]`` input is
treated as three equal channels, like the extension's ``HWC3``); the output is a control image
for a ControlNet (which reads it as float in [0, 1]). Resizing to the generation size is the
pipeline's job, not the preprocessor's.

=================  =============================================  ==========================
name               what it computes                               needs
=================  =============================================  ==========================
canny              ``cv2.Canny(image, low, high)`` (defaults      ``sdkit-core[control]``
                   100, 200), white edges on black
invert             ``255 - image`` ("invert (from white bg &      numpy
                   black line)")
threshold          ``255 where image > threshold (127) else 0``,  numpy
                   per channel ("threshold")
tile_resample      downscale by ``factor`` (>= 1.1; else the      numpy
                   image unchanged) with area averaging (each
                   output pixel the coverage-weighted mean of
                   the input pixels under it, as the extension's
                   ``cv2.INTER_AREA``)
blur_gaussian      ``cv2.GaussianBlur(image, (0, 0), sigma)``     ``sdkit-core[control]``
scribble_xdog      difference of Gaussians (sigma 0.5 and 5.0),   ``sdkit-core[control]``
                   white where ``2 * dog > threshold (32)``
=================  =============================================  ==========================

OpenCV is the library the extension itself calls, so edges match A1111's pixel for pixel. It is an
optional dependency: ``pip install "sdkit-core[control]"`` adds the ``opencv-python-headless`` wheel
(5.0.0.93: 153 MB installed on Linux x86-64, one package). The alternative, scikit-image 0.26, is
as big once its dependencies are counted (skimage 29 MB + scipy 113 MB + networkx, imageio,
tifffile: 157 MB), and its ``feature.canny`` smooths with a Gaussian first, so it draws other
edges than A1111's; kornia needs torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError, MissingDependencyError
from sdkit.known_backends import install_command

U8 = NDArray[np.uint8]
INSTALL_HINT = install_command("control", "sdkit-core")


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise MissingDependencyError(
            f"this ControlNet preprocessor needs OpenCV, which is not installed: {INSTALL_HINT}"
        ) from None
    return cv2


def _rgb(image: Any) -> U8:
    """A uint8 [H, W, 3] copy of ``image`` (grey [H, W] / [H, W, 1] repeated; alpha dropped)."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise InputError(f"a control image must be uint8, got {array.dtype}")
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4) or 0 in array.shape[:2]:
        raise InputError(f"a control image must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4], got {list(array.shape)}")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return np.ascontiguousarray(array[..., :3])


def canny(image: Any, low_threshold: int = 100, high_threshold: int = 200) -> U8:
    """OpenCV's Canny edge detector (white edges on black), the extension's "canny"."""
    if not 0 <= low_threshold <= high_threshold:
        raise InputError(f"canny thresholds must satisfy 0 <= low <= high, got {low_threshold}, {high_threshold}")
    edges = _cv2().Canny(_rgb(image), int(low_threshold), int(high_threshold))
    return np.repeat(np.asarray(edges, dtype=np.uint8)[..., None], 3, axis=2)


def invert(image: Any) -> U8:
    """``255 - image``: white-background line art to the black-background form ControlNets expect."""
    return (255 - _rgb(image)).astype(np.uint8)


def threshold(image: Any, level: int = 127) -> U8:
    """255 where a channel is above ``level``, else 0 (the extension's "threshold")."""
    if not 0 <= level <= 255:
        raise InputError(f"threshold level must be in 0..255, got {level}")
    return ((_rgb(image) > level).astype(np.uint8) * 255).astype(np.uint8)


def _area_weights(size: int, out: int) -> NDArray[np.float64]:
    """[out, size] coverage weights: row o averages input [o * size / out, (o + 1) * size / out)."""
    edges = np.arange(out + 1, dtype=np.float64) * (size / out)
    left, right = edges[:-1, None], edges[1:, None]
    pixels = np.arange(size, dtype=np.float64)[None, :]
    cover = np.clip(np.minimum(right, pixels + 1) - np.maximum(left, pixels), 0.0, None)
    return np.asarray(cover / (size / out), dtype=np.float64)


def tile_resample(image: Any, factor: float = 1.0) -> U8:
    """Downscale by ``factor`` with area averaging (the extension's "tile_resample"): sizes
    ``int(H / factor)`` x ``int(W / factor)``; a factor below 1.1 leaves the image as it is."""
    rgb = _rgb(image)
    if not factor > 0:
        raise InputError(f"tile_resample factor must be positive, got {factor}")
    if factor < 1.1:
        return rgb
    height, width = int(rgb.shape[0] / factor), int(rgb.shape[1] / factor)
    if height < 1 or width < 1:
        raise InputError(f"tile_resample factor {factor} leaves no pixel of a {rgb.shape[1]}x{rgb.shape[0]} image")
    rows, cols = _area_weights(rgb.shape[0], height), _area_weights(rgb.shape[1], width)
    averaged = np.einsum("oh,hwc,pw->opc", rows, rgb.astype(np.float64), cols)
    return np.asarray(np.clip(np.rint(averaged), 0, 255), dtype=np.uint8)


def blur_gaussian(image: Any, sigma: float = 9.0) -> U8:
    """OpenCV's Gaussian blur with kernel size from ``sigma`` (the extension's "blur_gaussian")."""
    if not sigma > 0:
        raise InputError(f"blur sigma must be positive, got {sigma}")
    return np.asarray(_cv2().GaussianBlur(_rgb(image), (0, 0), float(sigma)), dtype=np.uint8)


def scribble_xdog(image: Any, level: int = 32) -> U8:
    """Extended difference of Gaussians (the extension's "scribble_xdog"): white strokes where
    ``2 * (255 - dog) > level`` with ``dog = clip(255 - min_c(G5 - G0.5))``."""
    cv2 = _cv2()
    rgb = _rgb(image).astype(np.float32)
    fine, coarse = cv2.GaussianBlur(rgb, (0, 0), 0.5), cv2.GaussianBlur(rgb, (0, 0), 5.0)
    dog = (255 - np.min(coarse - fine, axis=2)).clip(0, 255).astype(np.uint8)
    out = np.zeros(rgb.shape, dtype=np.uint8)
    out[2 * (255 - dog.astype(np.int32)) > level] = 255
    return out


PREPROCESSORS: dict[str, Callable[..., U8]] = {
    "canny": canny,
    "invert": invert,
    "threshold": threshold,
    "tile_resample": tile_resample,
    "blur_gaussian": blur_gaussian,
    "scribble_xdog": scribble_xdog,
}
"""Preprocessors by the name A1111's ControlNet extension gives them."""


def preprocess(name: str, image: Any, **params: Any) -> U8:
    """Run the preprocessor ``name`` (a key of ``PREPROCESSORS``) on ``image``."""
    function = PREPROCESSORS.get(name)
    if function is None:
        raise InputError(f"unknown ControlNet preprocessor {name!r}; use one of {', '.join(PREPROCESSORS)}")
    try:
        return function(image, **params)
    except TypeError as exc:
        raise InputError(f"bad parameters for preprocessor {name!r}: {exc}") from None
