"""A video's frames written as an animated WebP and one PNG per frame (``sdkit generate
--video-frames N`` with a Wan model on stable-diffusion.cpp).

The parameters go where readers look for them: each PNG in its ``parameters`` text chunk (as
``save_png``, with ``Frame: i/N`` and ``FPS``), the WebP (``Frames: N``, ``FPS``) in its EXIF
``UserComment`` (A1111 writes WebP and JPEG parameters there), which Pillow writes and reads
back (``read_webp_parameters``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from sdkit.errors import InputError
from sdkit.pipelines.imaging.images import GenerationParameters, save_png

EXIF_IFD = 0x8769  # the Exif sub-IFD, which holds UserComment
USER_COMMENT = 0x9286
UNICODE = b"UNICODE\0"  # the character-code prefix of an EXIF UserComment (then UTF-16 big-endian)


def frame_parameters(parameters: GenerationParameters, index: int, count: int, fps: int) -> GenerationParameters:
    """``parameters`` with the frame's place and the video's rate appended (A1111-style labels)."""
    extra = (*parameters.extra, ("Frame", f"{index + 1}/{count}"), ("FPS", str(fps)))
    return dataclasses.replace(parameters, extra=extra)


def save_video(
    frames: Sequence[Image.Image], path: str | os.PathLike[str], parameters: GenerationParameters, fps: int
) -> tuple[Path, list[Path]]:
    """``frames`` as ``path`` (an animated, lossless WebP at ``fps``) and ``STEM-frame-000.png``...
    beside it; returns the WebP's path and the PNGs'."""
    if not frames:
        raise InputError("a video needs at least one frame")
    if fps < 1:
        raise InputError(f"fps must be at least 1, not {fps}")
    path = Path(path).with_suffix(".webp")
    exif = Image.Exif()
    whole = dataclasses.replace(parameters, extra=(*parameters.extra, ("Frames", str(len(frames))), ("FPS", str(fps))))
    exif.get_ifd(EXIF_IFD)[USER_COMMENT] = UNICODE + whole.a1111_text().encode("utf-16-be")
    rgb = [frame.convert("RGB") for frame in frames]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rgb[0].save(
            path, format="WEBP", save_all=True, append_images=rgb[1:], duration=round(1000 / fps), loop=0,
            lossless=True, exif=exif.tobytes(),
        )  # fmt: skip
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc}") from None
    pngs = []
    for index, frame in enumerate(rgb):
        png = path.with_name(f"{path.stem}-frame-{index:03d}.png")
        pngs.append(save_png(frame, png, frame_parameters(parameters, index, len(rgb), fps)))
    return path, pngs


def read_webp_parameters(path: str | os.PathLike[str]) -> str | None:
    """The A1111 parameters text ``save_video`` put in a WebP's EXIF (None: it has none)."""
    with Image.open(path) as image:
        comment = image.getexif().get_ifd(EXIF_IFD).get(USER_COMMENT)
    if not isinstance(comment, bytes):
        return comment if isinstance(comment, str) else None
    if comment.startswith(UNICODE):
        return comment[len(UNICODE) :].decode("utf-16-be")
    return comment.decode("utf-8", errors="replace")
