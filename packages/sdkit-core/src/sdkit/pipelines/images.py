"""Images in and out of a pipeline: init images to VAE input, VAE output to PIL, and PNG files that
carry the generation parameters in a ``parameters`` text chunk (the AUTOMATIC1111 format that
other tools read back)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.errors import InputError

if TYPE_CHECKING:
    from PIL import Image

# Display names A1111 writes for sdkit's canonical sampler and schedule names.
SAMPLER_LABELS = {
    "euler": "Euler",
    "euler_a": "Euler a",
    "euler_ancestral": "Euler a",
    "ddim": "DDIM",
    "dpmpp_2m": "DPM++ 2M",
    "dpmpp_2m_sde": "DPM++ 2M SDE",
    "dpmpp_sde": "DPM++ SDE",
    "heun": "Heun",
    "lms": "LMS",
    "pndm": "PLMS",
    "unipc": "UniPC",
    "dpm2": "DPM2",
    "dpm2_a": "DPM2 a",
    "lcm": "LCM",
}
SCHEDULE_LABELS = {
    "normal": "Automatic",
    "karras": "Karras",
    "exponential": "Exponential",
    "sgm_uniform": "SGM Uniform",
    "simple": "Simple",
    "beta": "Beta",
}


def load_init_image(image: Any, width: int | None, height: int | None) -> tuple[np.ndarray, int, int]:
    """An init image (PIL image, HWC uint8 array or a file path) as a ``[1, 3, H, W]`` float32
    array in [-1, 1], resized (Lanczos) to ``width`` x ``height`` when those differ from its size."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise InputError(f"init image not found: {path}")
        try:
            with Image.open(path) as opened:
                pil = opened.convert("RGB")
        except (UnidentifiedImageError, OSError) as exc:
            raise InputError(f"{path} is not a readable image: {exc}") from None
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4):
            raise InputError(f"an init image array must be uint8 HxWx3 (or 4), not {image.dtype}{list(image.shape)}")
        pil = Image.fromarray(image).convert("RGB")
    elif isinstance(image, Image.Image):
        pil = image.convert("RGB")
    else:
        raise InputError(f"init_image must be a PIL image, a uint8 array or a path, not {type(image).__name__}")
    # Without an explicit size, the image's own, rounded down to a multiple of 8 (as diffusers).
    width = width or max(8, pil.width // 8 * 8)
    height = height or max(8, pil.height // 8 * 8)
    if (pil.width, pil.height) != (width, height):
        pil = pil.resize((width, height), Image.Resampling.LANCZOS)
    array = np.asarray(pil, dtype=np.float32) / 255.0  # as diffusers' VaeImageProcessor
    return (array * 2.0 - 1.0).transpose(2, 0, 1)[None].copy(), width, height


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

    def a1111_text(self) -> str:
        """``prompt\\nNegative prompt: ...\\nSteps: 20, Sampler: Euler a, ...`` (A1111 style)."""
        sampler = SAMPLER_LABELS.get(self.sampler, self.sampler)
        schedule = SCHEDULE_LABELS.get(self.schedule, self.schedule)
        fields = [
            f"Steps: {self.steps}",
            f"Sampler: {sampler}",
            f"Schedule type: {schedule}",
            f"CFG scale: {self.guidance_scale:g}",
            f"Seed: {self.seed}",
            f"Size: {self.width}x{self.height}",
            f"Model: {self.model}",
        ]
        if self.strength is not None:
            fields.append(f"Denoising strength: {self.strength:g}")
        fields.append("Software: sdkit")
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        lines.append(", ".join(fields))
        return "\n".join(lines)


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
