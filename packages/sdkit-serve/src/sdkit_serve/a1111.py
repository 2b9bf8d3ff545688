"""AUTOMATIC1111's web API shapes, and the one mapping from them onto sdkit.

This is the only module that knows both sides. A request (``Txt2ImgRequest``/``Img2ImgRequest``,
the field names and defaults of A1111's ``/sdapi/v1/txt2img`` and ``/img2img``) becomes a
``GenerationPlan``: the keyword arguments of ``pipeline.generate``, the seed and batch layout, the
LoRAs named in the prompt, and every field sdkit does not act on with the reason, which the
response's ``info`` reports (never silently dropped). When the pipeline learns something new
(inpainting masks, hires fix, LoRA), only ``IGNORED`` and ``plan_generation`` change.

Values a field may carry without asking for anything (``enable_hr: false``, ``styles: []``) are
not reported: clients send A1111's full default payload.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from sdkit.errors import InputError
from sdkit.pipelines import GenerationRequest
from sdkit_serve.schemas import schedule_name

if TYPE_CHECKING:
    from PIL import Image

    from sdkit_serve.config import Limits

ANY = object()  # in IGNORED: the field changes nothing whatever its value (e.g. saving options)
_OFF: tuple[Any, ...] = (None, False, "", 0, [], {})
_NOT_YET_LORA = "LoRAs are not supported by the sdkit pipeline yet (issue 14)"
_INPAINT = "inpainting is not supported by the sdkit pipeline yet (issue 9): the whole image is redrawn"

# field -> (values that ask for nothing, or ANY; why sdkit ignores it)
IGNORED: dict[str, tuple[Any, str]] = {
    "styles": (_OFF, "A1111 prompt styles are a UI feature; put the text in the prompt"),
    "subseed": ((*_OFF, -1), "variation seeds are not supported"),
    "subseed_strength": (_OFF, "variation seeds are not supported"),
    "seed_resize_from_h": ((*_OFF, -1), "seed resizing is not supported"),
    "seed_resize_from_w": ((*_OFF, -1), "seed resizing is not supported"),
    "restore_faces": (_OFF, "face restoration is not supported"),
    "tiling": (_OFF, "tiling is not supported"),
    "eta": ((None, 1, 1.0), "eta is fixed by the sampler"),
    "s_min_uncond": (_OFF, "sigma tweaks are not supported"),
    "s_churn": (_OFF, "sigma tweaks are not supported"),
    "s_tmax": ((*_OFF, float("inf")), "sigma tweaks are not supported"),
    "s_tmin": (_OFF, "sigma tweaks are not supported"),
    "s_noise": ((None, 1, 1.0), "sigma tweaks are not supported"),
    "distilled_cfg_scale": (_OFF, "distilled guidance applies to Flux, which this pipeline is not"),
    "enable_hr": (_OFF, "hires fix is not supported by the sdkit pipeline yet (issue 9)"),
    "script_name": (_OFF, "A1111 scripts are not supported"),
    "script_args": (_OFF, "A1111 scripts are not supported"),
    "alwayson_scripts": (_OFF, "A1111 scripts and extensions (ControlNet...) are not supported"),
    "save_images": ((None, False), "the server never saves images; they are in the response"),
    "firstpass_image": (_OFF, "hires fix is not supported"),
    "image_cfg_scale": ((None,), "image CFG (instruct-pix2pix) is not supported"),
    "initial_noise_multiplier": ((None, 1, 1.0), "the noise multiplier is fixed at 1"),
    "latent_mask": (_OFF, _INPAINT),
    "mask": (_OFF, _INPAINT),
    "resize_mode": ((None, 0), "only resize_mode 0 (just resize) is supported"),
    # Meaningless without the field above them (hires fix, masks), or about saving, sessions, UI.
    **dict.fromkeys(
        (
            "denoising_strength@txt2img", "firstphase_width", "firstphase_height", "hr_scale", "hr_upscaler",
            "hr_second_pass_steps", "hr_resize_x", "hr_resize_y", "hr_checkpoint_name", "hr_additional_modules",
            "hr_sampler_name", "hr_scheduler", "hr_prompt", "hr_negative_prompt", "hr_cfg", "hr_distilled_cfg",
            "mask_blur", "mask_blur_x", "mask_blur_y", "mask_round", "inpainting_fill", "inpaint_full_res",
            "inpaint_full_res_padding", "inpainting_mask_invert", "do_not_save_samples", "do_not_save_grid",
            "comments", "infotext", "disable_extra_networks",
        ),
        (ANY, "has no effect here"),
    ),
}  # fmt: skip


class Txt2ImgRequest(BaseModel):
    """``/sdapi/v1/txt2img``: the fields sdkit honours are typed here; A1111's others (hires fix,
    scripts, ...) are accepted as extra fields and reported in ``info["ignored"]``."""

    model_config = ConfigDict(extra="allow")

    prompt: str = ""
    negative_prompt: str = ""
    seed: int = Field(-1, ge=-1, le=2**63 - 1, description="-1: a random seed; image i uses seed + i")
    sampler_name: str | None = Field(None, description="e.g. 'Euler a', 'DPM++ 2M'; see /sdapi/v1/samplers")
    sampler_index: str = Field("Euler", description="the older name of sampler_name, used when that is unset")
    scheduler: str | None = Field(None, description="'Automatic', 'Karras', ...; see /sdapi/v1/schedulers")
    batch_size: int = Field(1, ge=1, le=1024)
    n_iter: int = Field(1, ge=1, le=1024)
    steps: int = Field(50, ge=1, le=10_000)
    cfg_scale: float = Field(7.0, ge=0.0, le=100.0)
    width: int | None = Field(None, ge=8, le=65_536, multiple_of=8, description="default: the model's native size")
    height: int | None = Field(None, ge=8, le=65_536, multiple_of=8, description="default: the model's native size")
    denoising_strength: float | None = Field(None, ge=0.0, le=1.0, description="img2img only (hires fix: ignored)")
    send_images: bool = True
    # The model a request runs on (sdkit_serve.model_choice): override_settings' sd_model_checkpoint
    # and sd_vae; its other keys are reported in info["ignored"].
    override_settings: dict[str, Any] | None = Field(None, description="sd_model_checkpoint, sd_vae: for this request")
    override_settings_restore_afterwards: bool = True
    refiner_checkpoint: str | None = Field(None, description="an SDXL refiner from /sdapi/v1/sd-models")
    refiner_switch_at: float | None = Field(None, ge=0.0, le=1.0, description="the fraction before the refiner")
    force_task_id: str | None = Field(None, max_length=256, description="the id /internal/progress knows this task by")


class Img2ImgRequest(Txt2ImgRequest):
    """``/sdapi/v1/img2img``: base64 images in ``init_images`` (the first is used); ``mask`` is
    accepted and reported as ignored until the pipeline inpaints."""

    init_images: list[str] = Field(..., min_length=1, description="base64 PNG/JPEG, data: URLs too")
    denoising_strength: float | None = Field(0.75, ge=0.0, le=1.0)
    mask: str | None = None
    resize_mode: int = 0
    include_init_images: bool = False


class ImagesResponse(BaseModel):
    """A1111's response: base64 PNGs (each with its ``parameters`` text chunk), the request echoed
    back, and ``info``, a JSON *string* (as A1111) with seeds, infotexts and what was ignored."""

    images: list[str]
    parameters: dict[str, Any]
    info: str


@dataclass(frozen=True)
class Lora:
    name: str
    weight: float


@dataclass
class GenerationPlan:
    """What one A1111 request asks of the pipeline."""

    generate: dict[str, Any]  # pipeline.generate keyword arguments except seed/num_images/callback
    seed: int
    batch_size: int
    n_iter: int
    loras: list[Lora] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)
    send_images: bool = True

    def first_seed(self, iteration: int) -> int:
        """The seed of the first image of batch ``iteration`` (image i of the request: seed + i)."""
        return self.seed + iteration * self.batch_size


_EXTRA_NETWORK = re.compile(r"<(\w+):([^>]+)>")  # A1111's extra-network syntax: <lora:name:weight>


def parse_extra_networks(prompt: str) -> tuple[str, list[Lora], list[str]]:
    """``"a cat <lora:film:0.6>"`` -> ``("a cat ", [Lora("film", 0.6)], [])``; other kinds of tag
    (``<hypernet:...>``) come back by name in the third item. Tags are removed from the prompt, as
    A1111 does before encoding it."""
    loras: list[Lora] = []
    others: list[str] = []
    for kind, body in _EXTRA_NETWORK.findall(prompt):
        parts = body.split(":")
        if kind.lower() in ("lora", "lyco"):
            weight = parts[1] if len(parts) > 1 and parts[1].strip() else "1"
            try:
                loras.append(Lora(parts[0].strip(), float(weight)))
            except ValueError:
                raise InputError(f"<{kind}:{body}>: the weight must be a number, got {weight!r}") from None
        else:
            others.append(f"<{kind}:{body}>")
    return _EXTRA_NETWORK.sub("", prompt), loras, others


def ignored_fields(payload: BaseModel, mode: str) -> dict[str, str]:
    """Every field of the request that asks for something sdkit does not do, with the reason."""
    data = payload.model_dump(exclude_unset=True)
    declared = set(type(payload).model_fields)
    ignored: dict[str, str] = {}
    for name, value in data.items():
        key = f"{name}@{mode}" if f"{name}@{mode}" in IGNORED else name
        if key in IGNORED:
            neutral, reason = IGNORED[key]
            if neutral is not ANY and not _is_neutral(value, neutral):
                ignored[name] = reason
        elif name not in declared:
            ignored[name] = "not an A1111 field sdkit knows"
    return ignored


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # 0 == False in Python: a bool only matches a bool, so `tiling: 0` and `tiling: false` both pass
    # but `s_noise: true` is not taken for 1.
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def plan_generation(
    payload: Txt2ImgRequest, limits: Limits, init_image: Image.Image | None = None, known_loras: set[str] | None = None
) -> GenerationPlan:
    """Map a checked A1111 request onto ``pipeline.generate``. ``init_image``: img2img's decoded
    first init image. Sizes and counts over ``limits`` are an ``InputError`` (HTTP 400)."""
    mode = "img2img" if init_image is not None else "txt2img"
    # img2img without a size runs at the init image's: that is the size to check
    width = payload.width or (init_image.width if init_image is not None else None)
    height = payload.height or (init_image.height if init_image is not None else None)
    limits.check(width, height, payload.steps, payload.batch_size * payload.n_iter)
    prompt, loras, others = parse_extra_networks(payload.prompt)
    negative, negative_loras, negative_others = parse_extra_networks(payload.negative_prompt)
    ignored = ignored_fields(payload, mode)
    for tag in [*others, *negative_others]:
        ignored[f"prompt {tag}"] = "only <lora:...> extra networks are recognised"
    for lora in [*loras, *negative_loras]:
        missing = known_loras is not None and lora.name not in known_loras
        ignored[f"<lora:{lora.name}:{lora.weight:g}>"] = f"no LoRA named {lora.name!r}" if missing else _NOT_YET_LORA
    kwargs: dict[str, Any] = {
        "prompt": prompt,
        "negative_prompt": negative,
        "steps": payload.steps,
        "guidance_scale": payload.cfg_scale,
        "sampler": payload.sampler_name or payload.sampler_index,
        "schedule": schedule_name(payload.scheduler),
        "width": payload.width,
        "height": payload.height,
    }
    if init_image is not None:
        kwargs["init_image"] = init_image
        kwargs["strength"] = 0.75 if payload.denoising_strength is None else payload.denoising_strength
        if isinstance(payload, Img2ImgRequest) and len(payload.init_images) > 1:
            ignored["init_images"] = f"only the first of {len(payload.init_images)} init images is used"
    check_early(kwargs, payload.batch_size)
    seed = payload.seed if payload.seed >= 0 else secrets.randbits(32)
    return GenerationPlan(
        kwargs, seed, payload.batch_size, payload.n_iter, loras, ignored, send_images=payload.send_images
    )


def check_early(generate: dict[str, Any], num_images: int) -> None:
    """Check names and ranges now, so a typo is a 400 at once rather than after waiting in the
    queue: the pipeline's own ``GenerationRequest`` does every check."""
    GenerationRequest.create(**generate, num_images=num_images)


def echo_parameters(payload: Txt2ImgRequest) -> dict[str, Any]:
    """The response's ``parameters``: the request as received, init images left out unless asked
    for (``include_init_images``, as A1111)."""
    data = payload.model_dump()
    if isinstance(payload, Img2ImgRequest) and not payload.include_init_images:
        data["init_images"] = None
        data["mask"] = None
    return data


def build_info(
    plan: GenerationPlan, parameters: list[Any], model: str, *, interrupted: bool = False, worker: str = ""
) -> dict[str, Any]:
    """A1111's ``info`` object for the images made (``parameters``: their GenerationParameters),
    plus ``ignored`` (field -> reason), ``loras`` and ``interrupted``."""
    first = parameters[0] if parameters else None
    seeds = [p.seed for p in parameters] or [plan.seed]
    return {
        "prompt": plan.generate["prompt"],
        "all_prompts": [p.prompt for p in parameters],
        "negative_prompt": plan.generate["negative_prompt"],
        "all_negative_prompts": [p.negative_prompt for p in parameters],
        "seed": seeds[0],
        "all_seeds": seeds,
        "subseed": -1,
        "all_subseeds": [-1] * len(seeds),
        "subseed_strength": 0,
        "width": first.width if first else plan.generate["width"],
        "height": first.height if first else plan.generate["height"],
        "sampler_name": plan.generate["sampler"],
        "scheduler": first.schedule if first else plan.generate["schedule"],
        "cfg_scale": plan.generate["guidance_scale"],
        "steps": plan.generate["steps"],
        "batch_size": plan.batch_size,
        "n_iter": plan.n_iter,
        "denoising_strength": plan.generate.get("strength"),
        "sd_model_name": model,
        "sd_model_hash": None,
        "infotexts": [p.a1111_text() for p in parameters],
        "index_of_first_image": 0,
        "job_timestamp": "",
        "version": "sdkit",
        "ignored": plan.ignored,
        "loras": [{"name": lora.name, "weight": lora.weight, "applied": False} for lora in plan.loras],
        "interrupted": interrupted,
        "worker": worker,
    }
