"""AUTOMATIC1111's web API shapes, and the one mapping from them onto sdkit.

This is the only module that knows both sides. A request (``Txt2ImgRequest``/``Img2ImgRequest``,
the field names and defaults of A1111's ``/sdapi/v1/txt2img`` and ``/img2img``) becomes a
``GenerationPlan``: the keyword arguments of ``pipeline.generate``, the seed and batch layout, the
LoRA files the prompt's tags name (``extra_networks``), the ControlNets its units use, and every
field sdkit does not act on with the reason, which the response's ``info`` reports (never
silently dropped). The fields beyond the prompt and sampler (masks, hires fix, eta, ControlNet
units) map in ``a1111_fields``; when the pipeline learns something new, only ``IGNORED`` and
those mappings change.

Values a field may carry without asking for anything (``enable_hr: false``, ``styles: []``) are
not reported: clients send A1111's full default payload.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from sdkit.pipelines import GenerationRequest
from sdkit_serve import a1111_fields
from sdkit_serve.extra_networks import LORA_KINDS, Folders, tag_loras
from sdkit_serve.faces import FACE_SETTINGS, FaceSettings, generation_fields
from sdkit_serve.model_choice import MODEL_SETTINGS
from sdkit_serve.prompt_tags import Tag, find_tags, remove_tags
from sdkit_serve.schemas import schedule_name

if TYPE_CHECKING:
    from PIL import Image

    from sdkit_serve.config import Limits

ANY = object()  # in IGNORED: the field changes nothing whatever its value (e.g. saving options)
_OFF: tuple[Any, ...] = (None, False, "", 0, [], {})

# field -> (values that ask for nothing, or ANY; why sdkit ignores it). Fields sdkit honours in
# part (masks, hires fix, eta, ControlNet units...) are checked by ``sdkit_serve.a1111_fields``.
IGNORED: dict[str, tuple[Any, str]] = {
    "styles": (_OFF, "A1111 prompt styles are a UI feature; put the text in the prompt"),
    "subseed": ((*_OFF, -1), "variation seeds are not supported"),
    "subseed_strength": (_OFF, "variation seeds are not supported"),
    "seed_resize_from_h": ((*_OFF, -1), "seed resizing is not supported"),
    "seed_resize_from_w": ((*_OFF, -1), "seed resizing is not supported"),
    "tiling": (_OFF, "tiling is not supported"),
    "s_min_uncond": (_OFF, "sigma tweaks are not supported"),
    "s_churn": (_OFF, "sigma tweaks are not supported"),
    "s_tmax": ((*_OFF, float("inf")), "sigma tweaks are not supported"),
    "s_tmin": (_OFF, "sigma tweaks are not supported"),
    "distilled_cfg_scale": (_OFF, "distilled guidance applies to Flux, which this pipeline is not"),
    "script_name": (_OFF, "A1111 scripts are not supported"),
    "script_args": (_OFF, "A1111 scripts are not supported"),
    "save_images": ((None, False), "the server never saves images; they are in the response"),
    "enable_hr@img2img": (_OFF, "the hires fix is txt2img's (A1111's img2img has none)"),
    "firstpass_image": (_OFF, "a hires fix from a given first-pass image is not supported"),
    # image CFG acts only on instruct-pix2pix models, which sdkit does not load: no effect here
    "image_cfg_scale": (ANY, "has no effect here"),
    "initial_noise_multiplier": ((None, 1, 1.0), "the noise multiplier is fixed at 1"),
    "latent_mask": (_OFF, "a separate latent mask is not supported; the mask is used for both"),
    "mask_round": ((None, True), "the mask is always rounded (binarised at 128), as A1111's default"),
    "resize_mode": ((None, 0), "only resize_mode 0 (just resize) is supported"),
    # Meaningless without the field above them (hires fix, masks), or about saving, sessions, UI.
    **dict.fromkeys(
        (
            "denoising_strength@txt2img", "firstphase_width", "firstphase_height", "hr_checkpoint_name",
            "hr_additional_modules", "hr_sampler_name", "hr_scheduler", "hr_prompt", "hr_negative_prompt", "hr_cfg",
            "hr_distilled_cfg", "do_not_save_samples", "do_not_save_grid", "comments", "infotext",
            "disable_extra_networks",
        ),
        (ANY, "has no effect here"),
    ),
}  # fmt: skip
# override_settings keys a request may set for itself, and what takes them
OVERRIDES = {"CLIP_stop_at_last_layers": "clip_skip"}


class Txt2ImgRequest(BaseModel):
    """``/sdapi/v1/txt2img``: the fields sdkit honours are typed here; A1111's others (scripts,
    ...) are accepted as extra fields and reported in ``info["ignored"]``."""

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
    denoising_strength: float | None = Field(None, ge=0.0, le=1.0, description="img2img; txt2img: the hires pass's")
    eta: float | None = Field(None, ge=0.0, le=1.0, description="DDIM's eta (samplers that take it)")
    s_noise: float | None = Field(None, ge=0.0, le=10.0, description="noise multiplier of ancestral/SDE samplers")
    enable_hr: bool = Field(False, description="hires fix (txt2img): generate, upscale, img2img at the larger size")
    hr_scale: float = Field(2.0, ge=1.0, le=16.0)
    hr_upscaler: str | None = Field(None, description="'Latent' (default), 'Latent (nearest)', 'Lanczos', ...")
    hr_second_pass_steps: int = Field(0, ge=0, le=10_000, description="0: steps")
    hr_resize_x: int = Field(0, ge=0, le=65_536)
    hr_resize_y: int = Field(0, ge=0, le=65_536)
    alwayson_scripts: dict[str, Any] | None = Field(None, description="the ControlNet extension's units")
    send_images: bool = True
    # The model a request runs on (sdkit_serve.model_choice): override_settings' sd_model_checkpoint
    # and sd_vae; its other keys are reported in info["ignored"].
    override_settings: dict[str, Any] | None = Field(
        None, description="sd_model_checkpoint, sd_vae, CLIP_stop_at_last_layers (clip skip): for this request"
    )
    override_settings_restore_afterwards: bool = True
    refiner_checkpoint: str | None = Field(None, description="an SDXL refiner from /sdapi/v1/sd-models")
    refiner_switch_at: float | None = Field(None, ge=0.0, le=1.0, description="the fraction before the refiner")
    force_task_id: str | None = Field(None, max_length=256, description="the id /internal/progress knows this task by")
    restore_faces: bool | None = Field(None, description="face restoration (the server's --face-dir restorer)")


class Img2ImgRequest(Txt2ImgRequest):
    """``/sdapi/v1/img2img``: base64 images in ``init_images`` (the first is used); with ``mask``
    (white repaints) it inpaints, with A1111's inpainting fields."""

    init_images: list[str] = Field(..., min_length=1, description="base64 PNG/JPEG, data: URLs too")
    # The hires fix is txt2img's: A1111's img2img request has no such fields, so they stay out of
    # this schema (an img2img asking for it gets it reported, IGNORED["enable_hr@img2img"]).
    enable_hr: SkipJsonSchema[bool] = False
    hr_scale: SkipJsonSchema[float] = 2.0
    hr_upscaler: SkipJsonSchema[str | None] = None
    hr_second_pass_steps: SkipJsonSchema[int] = 0
    hr_resize_x: SkipJsonSchema[int] = 0
    hr_resize_y: SkipJsonSchema[int] = 0
    denoising_strength: float | None = Field(0.75, ge=0.0, le=1.0)
    mask: str | None = Field(None, description="base64 mask of init_images[0]'s size; white repaints")
    mask_blur: int | None = Field(None, ge=0, le=256, description="sets mask_blur_x and mask_blur_y")
    mask_blur_x: int = Field(4, ge=0, le=256)
    mask_blur_y: int = Field(4, ge=0, le=256)
    inpainting_fill: int = Field(0, ge=0, le=3, description="0 fill, 1 original, 2 latent noise, 3 latent nothing")
    inpaint_full_res: bool = Field(True, description="'only masked': generate a crop around the mask")
    inpaint_full_res_padding: int = Field(0, ge=0, le=65_536)
    inpainting_mask_invert: int = Field(0, ge=0, le=1, description="1: black repaints")
    resize_mode: int = 0
    include_init_images: bool = False


class ImagesResponse(BaseModel):
    """A1111's response: base64 PNGs (each with its ``parameters`` text chunk), the request echoed
    back, and ``info``, a JSON *string* (as A1111) with seeds, infotexts and what was ignored."""

    images: list[str]
    parameters: dict[str, Any]
    info: str


@dataclass
class GenerationPlan:
    """What one A1111 request asks of the pipeline."""

    generate: dict[str, Any]  # pipeline.generate keyword arguments except seed/num_images/callback
    seed: int
    batch_size: int
    n_iter: int
    loras: list[tuple[Path, float]] = field(default_factory=list)  # files and strengths, for set_loras
    ignored: dict[str, str] = field(default_factory=dict)
    send_images: bool = True
    controlnets: dict[str, Path] = field(default_factory=dict)  # ControlNet name -> folder, for set_controlnets

    def first_seed(self, iteration: int) -> int:
        """The seed of the first image of batch ``iteration`` (image i of the request: seed + i)."""
        return self.seed + iteration * self.batch_size


def extra_networks(prompt: str) -> tuple[str, list[Tag], list[str]]:
    """A1111's extra-network tags of a prompt: the prompt without the kinds sdkit does not know
    (as A1111 removes every tag before encoding; ``<lora:...>``, ``<lyco:...>`` and
    ``<hypernet:...>`` stay, as in the PNG's prompt, and the tokenizer leaves them out of the
    text it encodes), the tags, and the unknown ones as text. Linear time (``prompt_tags``)."""
    tags = find_tags(prompt)
    unknown = [t for t in tags if t.kind.lower() not in (*LORA_KINDS, "hypernet")]
    return remove_tags(prompt, unknown), tags, [t.text for t in tags if t.kind.lower() not in LORA_KINDS]


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


@dataclass(frozen=True)
class Inputs:
    """What a request brings besides its JSON: img2img's decoded images, the folders its
    LoRA tags and ControlNet units name, and the image decoder for the units' images."""

    init_image: Image.Image | None = None
    mask: Image.Image | None = None
    folders: Folders | None = None
    decode: Any = None  # (base64 text, what) -> RGB PIL image
    faces: FaceSettings | None = None  # the server's face folder and settings (None: none)


def plan_generation(payload: Txt2ImgRequest, limits: Limits, inputs: Inputs | None = None) -> GenerationPlan:
    """Map a checked A1111 request onto ``pipeline.generate``. Sizes, counts and prompt lengths
    over ``limits`` are an ``InputError`` (HTTP 400). Runs off the event loop: it reads folders,
    decodes ControlNet images and runs their preprocessors."""
    inputs = inputs or Inputs()
    init_image = inputs.init_image
    mode = "img2img" if init_image is not None else "txt2img"
    # img2img without a size runs at the init image's: that is the size to check
    width = payload.width or (init_image.width if init_image is not None else None)
    height = payload.height or (init_image.height if init_image is not None else None)
    limits.check(width, height, payload.steps, payload.batch_size * payload.n_iter)
    limits.check_prompt(payload.prompt, payload.negative_prompt)
    prompt, tags, others = extra_networks(payload.prompt)
    negative, negative_tags, negative_others = extra_networks(payload.negative_prompt)
    ignored = ignored_fields(payload, mode)
    for text in [*others, *negative_others]:
        ignored[f"prompt {text}"] = "only <lora:...> (and <lyco:...>) extra networks are supported"
    for tag in negative_tags:
        if tag.kind.lower() in LORA_KINDS:
            ignored[f"negative prompt {tag.text}"] = "extra networks apply from the prompt, as in A1111"
    apply_loras = not (payload.model_extra or {}).get("disable_extra_networks")
    loras = tag_loras(payload.prompt, tags, inputs.folders) if apply_loras else []
    sampler = payload.sampler_name or payload.sampler_index
    schedule = schedule_name(payload.scheduler)
    kwargs: dict[str, Any] = {
        "prompt": prompt,
        "negative_prompt": negative,
        "steps": payload.steps,
        "guidance_scale": payload.cfg_scale,
        "sampler": sampler,
        "schedule": schedule,
        "width": payload.width,
        "height": payload.height,
    }
    mapped = a1111_fields.sampler_fields(payload, sampler, schedule)
    mapped.merge(override_fields(payload.override_settings))
    if init_image is not None:
        kwargs["init_image"] = init_image
        kwargs["strength"] = 0.75 if payload.denoising_strength is None else payload.denoising_strength
        if isinstance(payload, Img2ImgRequest) and len(payload.init_images) > 1:
            ignored["init_images"] = f"only the first of {len(payload.init_images)} init images is used"
        if inputs.mask is not None:
            mapped.merge(a1111_fields.inpaint_fields(payload, inputs.mask))
    else:
        mapped.merge(a1111_fields.hires_fields(payload, sampler, schedule))
    size = (payload.width, payload.height) if payload.width and payload.height else None
    if size is None and init_image is not None and not (payload.width or payload.height):
        size = (init_image.width // 8 * 8, init_image.height // 8 * 8)
    context = a1111_fields.UnitContext(
        inputs.decode, inputs.folders.controlnet_dir if inputs.folders else None, init_image, size
    )
    mapped.merge(a1111_fields.controlnet_fields(payload.alwayson_scripts, context))
    face_fields, face_ignored = generation_fields(payload.restore_faces, payload.override_settings, inputs.faces)
    kwargs.update(mapped.generate, **face_fields)
    ignored.update(mapped.ignored, **face_ignored)
    check_early(kwargs, payload.batch_size)
    seed = payload.seed if payload.seed >= 0 else secrets.randbits(32)
    plan = GenerationPlan(kwargs, seed, payload.batch_size, payload.n_iter, loras, ignored, payload.send_images)
    plan.controlnets = mapped.controlnets
    return plan


def override_fields(settings: dict[str, Any] | None) -> a1111_fields.Mapped:
    """``override_settings``: the per-request settings sdkit applies (``OVERRIDES``, and the
    model and VAE, which ``model_choice`` takes); the others are reported."""
    mapped = a1111_fields.Mapped()
    for key, value in (settings or {}).items():
        if key in OVERRIDES and OVERRIDES[key] in GenerationRequest.field_names():
            mapped.generate[OVERRIDES[key]] = value
        elif key == "CLIP_stop_at_last_layers" and value in (None, 1):
            continue  # the last layer: what the pipeline does
        elif key in MODEL_SETTINGS or key in FACE_SETTINGS:
            continue  # the model and VAE: sdkit_serve.model_choice; face settings: sdkit_serve.faces
        else:
            mapped.ignored[f"override_settings.{key}"] = "this setting is not applied per request"
    return mapped


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
    plus ``ignored`` (field -> reason), ``loras`` (the files applied), ``controlnets`` and
    ``interrupted``. Every number in it is finite, so it is valid JSON."""
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
        "denoising_strength": plan.generate.get("strength", plan.generate.get("denoising_strength")),
        "sd_model_name": model,
        "sd_model_hash": None,
        "infotexts": [p.a1111_text() for p in parameters],
        "index_of_first_image": 0,
        "job_timestamp": "",
        "version": "sdkit",
        "ignored": plan.ignored,
        "loras": [{"name": path.stem, "weight": weight, "applied": True} for path, weight in plan.loras],
        "controlnets": sorted(plan.controlnets),
        "interrupted": interrupted,
        "worker": worker,
    }
