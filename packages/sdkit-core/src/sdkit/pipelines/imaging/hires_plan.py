"""Hires fix arithmetic, as A1111's txt2img (``modules/processing.py``): sizes, steps, latent upscale.

Hires fix generates at the first-pass size, upscales (the latent, or the decoded image with a
model-free resize), then runs img2img at the larger size. ``hires_plan`` computes A1111's numbers:

- Target size: ``hr_scale`` alone gives ``int(width * hr_scale)`` x ``int(height * hr_scale)``.
  ``hr_resize_x``/``hr_resize_y`` instead: one of them alone keeps the aspect
  (``hr_resize_x * height // width``); both: the upscale covers the box (the side that would fall
  short is grown to keep the aspect) and the excess is cut afterwards, centred, in latent pixels:
  ``truncate_x = (upscaled_width - hr_resize_x) // 8`` (``truncate_y`` likewise), the latent keeping
  columns ``truncate_x // 2 .. latent_width - (truncate_x + 1) // 2``.
- Steps: the second pass runs exactly ``hr_second_pass_steps`` (0: the first pass's ``steps``) steps:
  the last ones of a schedule computed for ``int(hr_steps / min(denoising_strength, 0.999))`` steps
  (A1111's ``setup_img2img_steps`` with the steps given). In sdkit's img2img terms:
  ``set_timesteps(schedule_steps)`` and start at index ``schedule_steps - hr_steps``.

Worked example: 512 x 768, hr_scale 1.5, steps 20, hr_second_pass_steps 0, denoising 0.7 -> target
768 x 1152 (latent 96 x 144), schedule of int(20 / 0.7) = 28 steps, the last 20 run.

``latent_upscale`` is A1111's "Latent" upscalers (``torch.nn.functional.interpolate`` of the latent
to ``target // 8``): "bilinear" ("Latent", align_corners False, no antialias), "nearest"
("Latent (nearest)": source index ``floor(i * in / out)``), "nearest-exact" ("Latent
(nearest-exact)": ``floor((i + 0.5) * in / out)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.upscalers import A1111_NAMES, UPSCALER_DIR_ENV, available_upscalers, find_upscaler

F32 = NDArray[np.float32]
LATENT_MODES = ("bilinear", "nearest", "nearest-exact")
# A1111's model-free upscalers, by the name its UI, API and PNG text use: the latent ones resize
# the latents (``latent_upscale``); the image ones decode, resize with PIL and encode again.
UPSCALERS = {
    "Latent": ("latent", "bilinear"),
    "Latent (nearest)": ("latent", "nearest"),
    "Latent (nearest-exact)": ("latent", "nearest-exact"),
    "Lanczos": ("image", "lanczos"),
    "Nearest": ("image", "nearest"),
}


def upscaler(name: str) -> tuple[str, str]:
    """``(kind, mode)`` of an A1111 upscaler name (case-insensitive): a model-free one, or
    ``("image", "model")`` for an ESRGAN / Real-ESRGAN file (a path, A1111's name such as
    "R-ESRGAN 4x+", or a file stem, found in ``$SDKIT_UPSCALER_DIR``); an InputError listing them."""
    for known, value in UPSCALERS.items():
        if known.lower() == str(name).lower():
            return value
    path = find_upscaler(str(name))
    if path is not None and path.is_file():
        return "image", "model"
    models = ", ".join(sorted(available_upscalers())) or f"none in ${UPSCALER_DIR_ENV}"
    raise InputError(
        f"unknown hires upscaler {name!r}; use one of {', '.join(UPSCALERS)} (model-free), "
        f"an upscaler .safetensors file or the name of one ({models})"
    )


def canonical_upscaler(name: str) -> str:
    """The A1111 spelling of an upscaler name (a model upscaler's name or path as given, A1111's
    own names in their spelling)."""
    kind_mode = upscaler(name)
    if kind_mode == ("image", "model"):
        return next((known for known in A1111_NAMES if known.lower() == str(name).lower()), str(name))
    return next(known for known, value in UPSCALERS.items() if value == kind_mode)


@dataclass(frozen=True)
class HiresPlan:
    width: int  # size of the upscaled image before truncation
    height: int
    truncate_x: int  # latent columns / rows cut after the upscale (centred)
    truncate_y: int
    steps: int  # second-pass steps that run
    schedule_steps: int  # length of the schedule they are the tail of

    @property
    def final_size(self) -> tuple[int, int]:
        """(width, height) of the output image."""
        return self.width - 8 * self.truncate_x, self.height - 8 * self.truncate_y


def _upscaled_size(width: int, height: int, hr_scale: float, resize_x: int, resize_y: int) -> tuple[int, int]:
    if resize_x == 0 and resize_y == 0:
        return int(width * hr_scale), int(height * hr_scale)
    if resize_y == 0:
        return resize_x, resize_x * height // width
    if resize_x == 0:
        return resize_y * width // height, resize_y
    if width / height < resize_x / resize_y:
        return resize_x, resize_x * height // width
    return resize_y * width // height, resize_y


def hires_plan(
    width: int,
    height: int,
    steps: int,
    *,
    hr_scale: float = 2.0,
    hr_resize_x: int = 0,
    hr_resize_y: int = 0,
    hr_second_pass_steps: int = 0,
    denoising_strength: float = 0.7,
) -> HiresPlan:
    """A1111's hires-fix sizes and steps (module docstring)."""
    if width < 1 or height < 1 or steps < 1 or hr_second_pass_steps < 0 or hr_resize_x < 0 or hr_resize_y < 0:
        raise InputError("hires fix needs positive sizes and steps")
    if not 0.0 < denoising_strength <= 1.0:
        raise InputError(f"denoising_strength must be in (0, 1], got {denoising_strength}")
    up_w, up_h = _upscaled_size(width, height, hr_scale, hr_resize_x, hr_resize_y)
    if up_w < 8 or up_h < 8 or (hr_resize_x == 0 and hr_resize_y == 0 and hr_scale < 1.0):
        raise InputError(f"hires fix target {up_w}x{up_h} is smaller than the first pass or too small")
    truncate_x = (up_w - hr_resize_x) // 8 if hr_resize_x and hr_resize_y else 0
    truncate_y = (up_h - hr_resize_y) // 8 if hr_resize_x and hr_resize_y else 0
    run = hr_second_pass_steps or steps
    return HiresPlan(up_w, up_h, truncate_x, truncate_y, run, int(run / min(denoising_strength, 0.999)))


def _source_index(out: int, size: int, mode: str) -> NDArray[np.int64]:
    scale = size / out
    offset = 0.5 if mode == "nearest-exact" else 0.0
    index = np.minimum(np.floor((np.arange(out) + offset) * scale).astype(np.int64), size - 1)
    return np.asarray(index, dtype=np.int64)


def _bilinear_axis(array: NDArray[np.float64], out: int, axis: int) -> NDArray[np.float64]:
    size = array.shape[axis]
    source = np.maximum((np.arange(out) + 0.5) * (size / out) - 0.5, 0.0)
    low = np.minimum(np.floor(source).astype(np.int64), size - 1)
    high = np.minimum(low + 1, size - 1)
    frac = source - low
    shape = [1] * array.ndim
    shape[axis] = out
    frac = frac.reshape(shape)
    blended = np.take(array, low, axis=axis) * (1.0 - frac) + np.take(array, high, axis=axis) * frac
    return np.asarray(blended, dtype=np.float64)


def latent_upscale(latents: F32, height: int, width: int, mode: str = "bilinear") -> F32:
    """[N, C, h, w] latents resized to [N, C, height, width] like torch's ``interpolate``."""
    x = np.asarray(latents, dtype=np.float32)
    if x.ndim != 4 or height < 1 or width < 1:
        raise InputError(f"latent_upscale needs [N, C, H, W] latents and a positive size, got {list(x.shape)}")
    if mode not in LATENT_MODES:
        raise InputError(f"unknown latent upscale mode {mode!r}; use one of {', '.join(LATENT_MODES)}")
    if mode == "bilinear":
        wide = _bilinear_axis(x.astype(np.float64), width, axis=3)
        return np.asarray(_bilinear_axis(wide, height, axis=2), dtype=np.float32)
    rows, cols = _source_index(height, x.shape[2], mode), _source_index(width, x.shape[3], mode)
    return np.ascontiguousarray(x[:, :, rows][:, :, :, cols])


def truncate_latents(latents: F32, plan: HiresPlan) -> F32:
    """Cut the centred excess ``plan.truncate_x``/``truncate_y`` latent pixels, as A1111 does."""
    x = np.asarray(latents, dtype=np.float32)
    ty, tx = plan.truncate_y, plan.truncate_x
    return np.ascontiguousarray(x[:, :, ty // 2 : x.shape[2] - (ty + 1) // 2, tx // 2 : x.shape[3] - (tx + 1) // 2])
