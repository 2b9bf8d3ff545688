"""Model upscalers (ESRGAN, Real-ESRGAN, Real-ESRGAN Compact, SwinIR) run in overlapping tiles.

    up = ModelUpscaler("RealESRGAN_x4plus.safetensors")       # detected: ESRGAN 4x, nf 64, nb 23
    big = up.upscale(image, scale=2)                          # A1111's semantics, a PIL image

The file's architecture and layout are detected from its keys and shapes
(``sdkit.families.upscalers``), its weights fill the shipped weightless graph, and any backend
compiles it (one engine per tile shape: every tile of an image at least ``tile`` pixels wide is
``tile`` x ``tile``). The image runs in tiles of ``tile`` input pixels overlapping by ``overlap``,
blended with linear ramps (``sdkit.pipelines.stages.tiling``): a convolutional network's output
near a tile's border sees less context than the whole image's, the ramps hide that seam.
Real-ESRGAN x2plus is padded (reflect) to an even size first and cropped after, as spandrel does;
SwinIR to a multiple of its window (8; its graph takes any such size, the shifted windows' masks
are computed in the graph), and its tiles and overlap must be multiples of the window: the
defaults (192/16) are, for window 8; for another window they are rounded to its multiples (tile
down, overlap up), and explicit values that are not are refused.

``upscale(image, scale)`` follows A1111's ``Upscaler.upscale``: the target is
``int(width * scale) // 8 * 8`` (height likewise); the model runs up to 3 times while the image
is smaller than the target (a 4x model run once for 2x, twice for 8x; a 1x model once), then a Lanczos resize
gives the exact target. Pixels go in as RGB floats in [0, 1] (as spandrel and ComfyUI feed
them), come out clamped to [0, 1] and rounded to 8 bits.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.upscalers import (
    UPSCALER_DIR_ENV,
    SwinIRConfig,
    UpscalerConfig,
    UpscalerFile,
    available_upscalers,
    find_graph,
    find_upscaler,
    upscaler_folders,
)
from sdkit.limits import check_bytes
from sdkit.pipelines.stages.shipped_net import ShippedNetwork, compile_network
from sdkit.pipelines.stages.tiling import tiled_map

F32 = NDArray[np.float32]
DEFAULT_TILE = 192  # A1111's ESRGAN_tile
DEFAULT_OVERLAP = 16
MAX_PASSES = 3  # A1111 runs a model at most 3 times to reach a scale


class ModelUpscaler(ShippedNetwork[UpscalerConfig | SwinIRConfig]):
    """An upscaler file compiled on a backend, ready to upscale images."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        backend: str = "auto",
        device: str | None = None,
        *,
        tile: int = DEFAULT_TILE,
        overlap: int = DEFAULT_OVERLAP,
        graphs: Iterable[str | os.PathLike[str]] = (),
        **options: Any,
    ) -> None:
        with closing(UpscalerFile(path)) as file:
            model = self.fill(file, find_graph, graphs, path)
        self.layout = file.layout
        self.tile, self.overlap = aligned_tiles(tile, overlap, self.config.multiple_of)
        self.compiled = compile_network(model, "upscaler", backend, device, options)

    @property
    def scale(self) -> int:
        return self.config.scale

    def _run(self, x: F32) -> F32:
        return np.asarray(self.compiled.run({"image": np.ascontiguousarray(x)})["upscaled"], dtype=np.float32)

    def upscale_array(self, pixels: F32) -> F32:
        """``[N, H, W, 3]`` RGB floats in [0, 1] -> ``[N, sH, sW, 3]`` clamped to [0, 1] (one
        pass of the model, ``s`` its scale)."""
        x = np.asarray(pixels, dtype=np.float32)
        if x.ndim != 4 or x.shape[3] != 3 or min(x.shape[1:3]) < 2:
            raise InputError(f"upscaler input must be [N, H, W, 3] RGB, at least 2x2, got {list(x.shape)}")
        height, width = x.shape[1:3]
        s = self.scale
        # the tiles' float64 sums and weights at the output size, plus the float32 result
        out_pixels = (height + self.config.multiple_of) * (width + self.config.multiple_of) * s * s
        check_bytes(out_pixels * (4 * 8 + 3 * 4), f"upscaling a {width}x{height} image {s}x")
        align = self.config.multiple_of
        nchw = pad_like_spandrel(x.transpose(0, 3, 1, 2), self.config.min_size, align)
        rows = []
        for one in nchw:
            if self.tile:
                out = tiled_map(one[None], self._run, self.tile, self.overlap, align=align, component="upscaler")
            else:
                out = self._run(one[None])
            rows.append(out[0])
        result = np.stack(rows)[:, :, : height * s, : width * s]
        return np.asarray(np.clip(result, 0.0, 1.0).transpose(0, 2, 3, 1), dtype=np.float32)

    def upscale(self, image: Any, scale: float | None = None) -> Any:
        """A PIL image upscaled by ``scale`` (None: the model's own) as A1111's upscalers do
        (module docstring)."""
        from PIL import Image

        scale = float(self.scale if scale is None else scale)
        if not scale > 0:
            raise InputError(f"upscale factor must be positive, got {scale}")
        img = image.convert("RGB")
        dest_w, dest_h = int(img.width * scale) // 8 * 8, int(img.height * scale) // 8 * 8
        if dest_w < 1 or dest_h < 1:
            raise InputError(f"a {img.width}x{img.height} image scaled by {scale:g} is empty")
        for i in range(MAX_PASSES):
            if img.width >= dest_w and img.height >= dest_h and (i > 0 or scale != 1):
                break
            pixels = np.asarray(img, dtype=np.float32)[None] / 255.0
            before = img.size
            img = Image.fromarray(to_uint8(self.upscale_array(pixels))[0])
            if img.size == before:  # a 1x model: once is what it does
                break
        if img.size != (dest_w, dest_h):
            img = img.resize((dest_w, dest_h), Image.Resampling.LANCZOS)
        return img


def aligned_tiles(tile: int, overlap: int, align: int) -> tuple[int, int]:
    """The tile and overlap a graph whose sizes must be multiples of ``align`` runs: as given, or
    the defaults (192/16) rounded to multiples (tile down, overlap up: SwinIR's window 7 gives
    189/21); other values that are not multiples are refused."""
    if (tile, overlap) == (DEFAULT_TILE, DEFAULT_OVERLAP) and (tile % align or overlap % align):
        tile, overlap = tile - tile % align, overlap + -overlap % align
    if tile and (tile % align or overlap % align or not 0 <= overlap < tile):
        raise InputError(f"upscaler tiles need 0 <= overlap < tile, both multiples of {align}; got {tile}/{overlap}")
    return tile, overlap


def pad_like_spandrel(nchw: F32, minimum: int, align: int) -> F32:
    """Pad at the bottom/right as spandrel does before a model runs (cropped after): up to
    ``minimum`` (its descriptor's size requirement: reflect, then edge beyond ``size - 1``), then
    to a multiple of ``align`` (reflect: ``pad_to_multiple`` / the unshuffle's padding)."""
    for axis in (2, 3):
        size = nchw.shape[axis]
        short = max(minimum - size, 0)
        widths = [(0, 0)] * 4
        if short:
            widths[axis] = (0, min(short, size - 1))
            nchw = np.pad(nchw, widths, mode="reflect")
            widths[axis] = (0, short - min(short, size - 1))
            nchw = np.pad(nchw, widths, mode="edge")
        if rest := -nchw.shape[axis] % align:
            widths[axis] = (0, rest)
            nchw = np.pad(nchw, widths, mode="reflect")
    return nchw


def to_uint8(pixels: F32) -> NDArray[np.uint8]:
    """[0, 1] floats -> 8 bits, rounded (as spandrel-based UIs write upscaler output)."""
    return np.asarray(np.round(np.clip(pixels, 0.0, 1.0) * 255.0), dtype=np.uint8)


def resolve_upscaler(name: str | os.PathLike[str], folders: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """The file of an upscaler: a path, A1111's name ("R-ESRGAN 4x+"...) or a file stem found in
    ``folders`` or ``$SDKIT_UPSCALER_DIR``; an InputError listing what is there otherwise."""
    path = find_upscaler(str(name), folders)
    if path is not None:
        return path
    found = sorted(available_upscalers(folders))
    where = ", ".join(str(f) for f in upscaler_folders(folders)) or f"no folder (set ${UPSCALER_DIR_ENV})"
    listed = ", ".join(found) if found else "none"
    raise InputError(f"unknown upscaler {str(name)!r}: not a file, and not among the upscalers in {where} ({listed})")


_LOADED: dict[tuple[Any, ...], ModelUpscaler] = {}
_KEEP = 2  # compiled upscalers kept for reuse (a server answering extras requests)


def load_upscaler(
    name: str | os.PathLike[str],
    backend: str = "auto",
    device: str | None = None,
    *,
    folders: Iterable[str | os.PathLike[str]] = (),
    tile: int = DEFAULT_TILE,
    overlap: int = DEFAULT_OVERLAP,
    **options: Any,
) -> ModelUpscaler:
    """A compiled upscaler by name or path, reused while its file is unchanged (the last two)."""
    path = resolve_upscaler(name, folders)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None  # UpscalerFile says what is wrong with the path
    key = (str(path.resolve()), stamp, backend, device, tile, overlap, tuple(sorted(options.items())))
    if key not in _LOADED:
        upscaler = ModelUpscaler(path, backend, device, tile=tile, overlap=overlap, **options)
        while len(_LOADED) >= _KEEP:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = upscaler
    return _LOADED[key]


def upscale(
    image: Any,
    model: str | os.PathLike[str],
    scale: float | None = None,
    *,
    backend: str = "auto",
    device: str | None = None,
    folders: Iterable[str | os.PathLike[str]] = (),
    tile: int = DEFAULT_TILE,
    overlap: int = DEFAULT_OVERLAP,
    **options: Any,
) -> Any:
    """Upscale a PIL image (or an image file's path) with an ESRGAN / Real-ESRGAN file, as
    A1111's upscalers do; ``scale`` None is the model's own. Returns a PIL image.

        big = sdkit.upscale("photo.png", "RealESRGAN_x4plus.safetensors", scale=2)
    """
    image = opened_image(image)
    upscaler = load_upscaler(model, backend, device, folders=folders, tile=tile, overlap=overlap, **options)
    return upscaler.upscale(image, scale)


def opened_image(image: Any) -> Any:
    """A PIL image as given, or an image file's path read as RGB (an InputError if it cannot be)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as opened:
                return opened.convert("RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise InputError(f"cannot read image {image}: {exc}") from None
    return image
