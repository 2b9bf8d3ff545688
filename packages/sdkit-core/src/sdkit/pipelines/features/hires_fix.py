"""Hires fix as A1111's txt2img does it: generate, upscale, then img2img at the larger size.

    pipe.generate("a castle", width=512, height=512, steps=20, enable_hr=True, hr_scale=2,
                  hr_upscaler="Latent", hr_second_pass_steps=10, denoising_strength=0.7)

1. The first pass is the txt2img request at ``width`` x ``height``.
2. Its latents are upscaled to A1111's target (``sdkit.pipelines.imaging.hires_plan.hires_plan``: ``hr_scale``
   or ``hr_resize_x/y``, rounded down to the VAE's factor): a "Latent" upscaler resizes the
   latents (``latent_upscale``, torch's ``interpolate``); an image upscaler ("Lanczos",
   "Nearest": model-free, PIL; or an ESRGAN / Real-ESRGAN file by A1111's name, "R-ESRGAN 4x+",
   found in ``$SDKIT_UPSCALER_DIR``, or by path: ``sdkit.pipelines.stages.upscaler``, compiled
   on the VAE's backend) decodes them, resizes the 8-bit images as A1111 does, and encodes
   them again (a posterior sample drawn from the same noise stream). With both ``hr_resize_x``
   and ``hr_resize_y`` the excess is cut, centred, from the latents.
3. The second pass is img2img from those latents at the target size: the last
   ``hr_second_pass_steps`` (0: ``steps``) steps of a schedule of
   ``int(second_pass_steps / min(denoising_strength, 0.999))`` steps, the latents noised to its
   first timestep with the next draw of the same noise stream (A1111 draws new noise from the
   seed: another RNG either way), prompts encoded again (SDXL's ``time_ids`` take the new size),
   ControlNet images resized to the new size.

The PNG carries A1111's labels: ``Size`` is the first pass's, then ``Denoising strength``,
``Hires upscale`` (or ``Hires resize: WxH``), ``Hires steps`` (when not 0) and ``Hires upscaler``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.families.upscalers import UpscalerFile, find_graph, find_upscaler
from sdkit.pipelines.imaging.hires_plan import HiresPlan, hires_plan, latent_upscale, truncate_latents, upscaler
from sdkit.pipelines.request import HIRES_DEFAULTS, GenerationPlan, GenerationRequest, StepCallback
from sdkit.pipelines.stages.upscaler import ModelUpscaler, load_upscaler


@dataclass
class HiresStage:
    """The second pass: its plan (target size, the schedule's tail set), A1111's numbers and the
    upscaler's kind ("latent" or "image") and mode."""

    plan: GenerationPlan
    numbers: HiresPlan
    kind: str
    mode: str
    factor: int  # the VAE's: image pixels per latent
    model: Path | None = None  # an ESRGAN / Real-ESRGAN file (mode "model")

    @property
    def latent_size(self) -> tuple[int, int]:
        """(height, width) of the upscaled latents before the centred cut."""
        return self.numbers.height // self.factor, self.numbers.width // self.factor


def second_pass_request(request: GenerationRequest, factor: int) -> tuple[GenerationRequest, HiresPlan]:
    """A1111's numbers for ``request`` and the txt2img request of the second pass's size (the
    pipeline plans it: size checks, ControlNet images, SDXL's sizes)."""
    width, height = request.width or 0, request.height or 0
    numbers = hires_plan(
        width,
        height,
        request.steps,
        hr_scale=request.hr_scale,
        hr_resize_x=request.hr_resize_x,
        hr_resize_y=request.hr_resize_y,
        hr_second_pass_steps=request.hr_second_pass_steps,
        denoising_strength=request.denoising_strength,
    )
    width, height = numbers.width // factor * factor, numbers.height // factor * factor
    both = request.hr_resize_x and request.hr_resize_y  # A1111 cuts in latents of 8; this VAE's factor
    cut_x = (width - request.hr_resize_x) // factor if both else 0
    cut_y = (height - request.hr_resize_y) // factor if both else 0
    numbers = HiresPlan(width, height, cut_x, cut_y, numbers.steps, numbers.schedule_steps)
    final_width, final_height = width - factor * cut_x, height - factor * cut_y
    changes = {name: value for name, value in own_fields(request).items() if value is not None}
    second = request.replace(
        width=final_width, height=final_height, enable_hr=False, latents=None, **{**HIRES_DEFAULTS, **changes}
    )
    return second, numbers


def own_fields(request: GenerationRequest) -> dict[str, Any]:
    """The second pass's own sampler, schedule and prompts (None: the first pass's); a sampler
    of its own keeps the first pass's sampler options it takes."""
    fields: dict[str, Any] = {
        "prompt": request.hr_prompt or None,
        "negative_prompt": request.hr_negative_prompt or None,
        "guidance_scale": request.hr_guidance_scale,
    }
    if request.hr_sampler is not None:
        from sdkit.plugins import get_plugins

        takes = getattr(get_plugins().schedulers.get(request.hr_sampler), "option_defaults", {})
        fields.update(
            sampler=request.hr_sampler,
            schedule=request.hr_schedule,
            sampler_options={k: v for k, v in request.sampler_options.items() if k in takes},
        )
    return fields


# scheduler, steps, strength, latent shape: how a pipeline sets a schedule (``Pipeline.start_schedule``)
ScheduleStarter = Callable[[Any, int, float, tuple[int, ...]], None]


def hires_stage(
    second: GenerationPlan, numbers: HiresPlan, upscaler_name: str, factor: int, start: ScheduleStarter | None = None
) -> HiresStage:
    """The stage for a planned second pass: its scheduler set to the tail A1111 runs (``start``:
    the pipeline's way to set a whole schedule, a flow model's with its ``mu`` and sigmas for the
    second pass's size; None: ``set_timesteps(steps)``)."""
    scheduler = second.scheduler
    if start is None:
        scheduler.set_timesteps(numbers.schedule_steps)
    else:
        start(scheduler, numbers.schedule_steps, 1.0, second.latent_shape)
    scheduler.set_begin_index((numbers.schedule_steps - numbers.steps) * scheduler.order)
    kind, mode = upscaler(upscaler_name)
    model = find_upscaler(upscaler_name) if mode == "model" else None
    if model is not None:  # a pickle, a file of no known architecture or shape: refused before the first pass
        file = UpscalerFile(model)
        try:
            find_graph(file.config)
        finally:
            file.close()
    return HiresStage(second, numbers, kind, mode, factor, model)


def parameters(request: GenerationRequest) -> dict[str, str]:
    """A1111's PNG labels for the hires fix of ``request``."""
    labels = {"Denoising strength": f"{request.denoising_strength:g}"}
    if request.hr_resize_x or request.hr_resize_y:
        labels["Hires resize"] = f"{request.hr_resize_x}x{request.hr_resize_y}"
    else:
        labels["Hires upscale"] = f"{request.hr_scale:g}"
    if request.hr_second_pass_steps:
        labels["Hires steps"] = str(request.hr_second_pass_steps)
    labels["Hires upscaler"] = request.hr_upscaler
    if request.hr_sampler is not None:
        from sdkit.schedulers.names import sampler_label

        labels["Hires sampler"] = sampler_label(request.hr_sampler)
    if request.hr_guidance_scale is not None:
        labels["Hires CFG Scale"] = f"{request.hr_guidance_scale:g}"
    if request.hr_prompt:
        labels["Hires prompt"] = request.hr_prompt
    if request.hr_negative_prompt:
        labels["Hires negative prompt"] = request.hr_negative_prompt
    return labels


def upscale_latents(
    stage: HiresStage,
    latents: np.ndarray,
    decode: Callable[[np.ndarray], np.ndarray],
    encode: Callable[[np.ndarray], np.ndarray],
    backend: tuple[str, Any] = ("auto", None),
) -> np.ndarray:
    """The first pass's latents at the second pass's size (before noise): resized latents, or
    decoded, resized as 8-bit images (by PIL, or an upscaler model compiled on ``backend``:
    name and device) and encoded again; then the centred cut."""
    height, width = stage.latent_size
    if stage.kind == "latent":
        upscaled = latent_upscale(latents, height, width, stage.mode)
    elif stage.model is not None:
        upscaler = load_upscaler(stage.model, backend[0], backend[1])
        images = model_resize_images(decode(latents), stage.numbers.width, stage.numbers.height, upscaler)
        upscaled = encode(images)
    else:
        images = resize_images(decode(latents), stage.numbers.width, stage.numbers.height, stage.mode)
        upscaled = encode(images)
    return truncate_latents(upscaled, stage.numbers)


def resize_images(pixels: np.ndarray, width: int, height: int, mode: str) -> np.ndarray:
    """``[N, H, W, 3]`` pixels in [0, 1] -> 8-bit PIL images resized (Lanczos or nearest) -> the
    VAE's ``[N, 3, height, width]`` input in [-1, 1]."""
    from PIL import Image

    from sdkit.pipelines.imaging.images import float_to_pil

    resample = Image.Resampling.LANCZOS if mode == "lanczos" else Image.Resampling.NEAREST
    rows = []
    for image in float_to_pil(pixels):
        resized = np.asarray(image.resize((width, height), resample), dtype=np.float32) / 255.0
        rows.append((resized * 2.0 - 1.0).transpose(2, 0, 1))
    return np.stack(rows).astype(np.float32)


def model_resize_images(pixels: np.ndarray, width: int, height: int, upscaler: ModelUpscaler) -> np.ndarray:
    """A1111's ``resize_image`` with an upscaler model: each 8-bit image upscaled by
    ``max(width / w, height / h)`` (when above 1) as its upscalers do, then Lanczos to the exact
    size -> the VAE's ``[N, 3, height, width]`` input in [-1, 1]."""
    from PIL import Image

    from sdkit.pipelines.imaging.images import float_to_pil

    rows = []
    for decoded in float_to_pil(pixels):
        scale = max(width / decoded.width, height / decoded.height)
        image = upscaler.upscale(decoded, scale) if scale > 1.0 else decoded
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.LANCZOS)
        resized = np.asarray(image, dtype=np.float32) / 255.0
        rows.append((resized * 2.0 - 1.0).transpose(2, 0, 1))
    return np.stack(rows).astype(np.float32)


def counting(callback: StepCallback | None, offset: int, total: int) -> StepCallback | None:
    """``callback`` numbering the steps of both passes as one run of ``total``."""
    if callback is None:
        return None
    target = callback
    return lambda index, _count, latents: target(offset + index, total, latents)
