"""Images in and out of a pipeline: init images to VAE input, VAE output to PIL, and PNG files that
carry the generation parameters in a ``parameters`` text chunk (the AUTOMATIC1111 format that
other tools read back)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.errors import InputError
from sdkit.limits import check_bytes
from sdkit.schedulers import sampler_label, schedule_label

if TYPE_CHECKING:
    from PIL import Image


def open_init_image(image: Any, what: str = "init image") -> Image.Image:
    """An init image (PIL image, HxWx3 or HxWx4 uint8 array, or a file path) as an RGB PIL image;
    an InputError naming ``what`` when it cannot be one."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise InputError(f"{what} not found: {path}")
        try:
            with Image.open(path) as opened:  # reads the header only: the size is known first
                # decoded RGB, then float32 for the VAE: refused before a pixel is decoded
                check_bytes(opened.width * opened.height * 3 * 5, f"init image {path} ({opened.width}x{opened.height})")
                rgb: Image.Image = opened.convert("RGB")
                return rgb
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise InputError(f"{what} {path} is not a readable image: {exc}") from None
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4):
            raise InputError(f"the {what} array must be uint8 HxWx3 (or 4), not {image.dtype}{list(image.shape)}")
        return Image.fromarray(image).convert("RGB")
    if isinstance(image, Image.Image):
        return image.convert("RGB")  # a copy: the request must not change with the caller's image
    raise InputError(f"the {what} must be a PIL image, a uint8 array or a path, not {type(image).__name__}")


def init_image_size(image: Image.Image, width: int | None, height: int | None) -> tuple[int, int]:
    """The size to generate at: the one asked for, else the image's own rounded down to a
    multiple of 8 (as diffusers)."""
    return width or max(8, image.width // 8 * 8), height or max(8, image.height // 8 * 8)


def init_image_array(image: Image.Image, width: int, height: int) -> np.ndarray:
    """An RGB image as the VAE's ``[1, 3, H, W]`` float32 input in [-1, 1], resized (Lanczos) to
    ``width`` x ``height`` when its size differs."""
    from PIL import Image

    if (image.width, image.height) != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    array = np.asarray(image, dtype=np.float32) / 255.0  # as diffusers' VaeImageProcessor
    result: np.ndarray = (array * 2.0 - 1.0).transpose(2, 0, 1)[None].copy()
    return result


def decoded_to_float(decoded: np.ndarray) -> np.ndarray:
    """VAE output ``[N, 3, H, W]`` in [-1, 1] -> ``[N, H, W, 3]`` float32 in [0, 1]."""
    pixels: np.ndarray = np.clip(decoded / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1).astype(np.float32)
    return pixels


def float_to_pil(images: np.ndarray) -> list[Image.Image]:
    from PIL import Image

    return [Image.fromarray(np.round(image * 255).astype(np.uint8)) for image in images]


@dataclass(frozen=True)
class GenerationParameters:
    """What produced an image, as written into (and read back from) its PNG."""

    prompt: str
    negative_prompt: str
    steps: int
    sampler: str
    schedule: str
    guidance_scale: float
    seed: int
    width: int
    height: int
    model: str
    strength: float | None = None
    extra: tuple[tuple[str, str], ...] = ()  # more "Label: value" fields (A1111's labels), in order

    def a1111_text(self) -> str:
        """``prompt\\nNegative prompt: ...\\nSteps: 20, Sampler: Euler a, ...`` (A1111 style). Labels
        come from the scheduler classes (``label``) and the schedules' table in ``sdkit.schedulers``."""
        fields = [
            f"Steps: {self.steps}",
            f"Sampler: {sampler_label(self.sampler)}",
            f"Schedule type: {schedule_label(self.schedule)}",
            f"CFG scale: {self.guidance_scale:g}",
            f"Seed: {self.seed}",
            f"Size: {self.width}x{self.height}",
            f"Model: {self.model}",
        ]
        if self.strength is not None:
            fields.append(f"Denoising strength: {self.strength:g}")
        fields.extend(f"{label}: {_quote(value)}" for label, value in self.extra)
        fields.append("Software: sdkit")
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        lines.append(", ".join(fields))
        return "\n".join(lines)


def _quote(value: str) -> str:
    """A value as A1111 writes it: JSON-quoted when it holds a comma, colon or newline."""
    if "," not in value and ":" not in value and "\n" not in value:
        return value
    return json.dumps(value, ensure_ascii=False)


def save_png(image: Image.Image, path: str | os.PathLike[str], parameters: GenerationParameters) -> Path:
    """Write ``image`` as PNG with the parameters in a ``parameters`` tEXt chunk."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", parameters.a1111_text())
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, format="PNG", pnginfo=info)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc}") from None
    return path
