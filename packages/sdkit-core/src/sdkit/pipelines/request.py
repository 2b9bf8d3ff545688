"""``GenerationRequest``: one generation, checked once, in canonical form; ``GenerationPlan``: that
request bound to a pipeline (size, latent shape, seeds, scheduler), the input of every stage.

    request = GenerationRequest.create(prompt="a castle", sampler="DPM++ 2M Karras", steps=25, seed=1)
    request.sampler, request.schedule      # ("dpmpp_2m", "karras"): resolved once, here
    images = pipe.run(request)             # or pipe.generate(request); pipe.generate("a castle", steps=25)

``create`` checks every field without loading a model (the CLI builds the request before loading,
so a typo fails in a second) and raises ``InputError`` / ``OptionError`` / ``UnknownSchedulerError``
naming the field. What depends on the model (the size a multiple of the VAE factor, a VAE encoder
for img2img, the latents' shape, the steps the scheduler config allows) is checked once more, by
the pipeline, against its ``PipelineConfig`` (``Pipeline.plan``).

Adding a field (the pattern issues 9, 10 and 14 follow: negative prompt weights, clip skip, LoRAs,
mask, control images, hires settings, refiner split...):

    @dataclass(frozen=True, eq=False)
    class GenerationRequest:
        ...
        clip_skip: int = 1                            # 1. the field, with the default users know

        @classmethod
        def checked(cls, values):
            values = ...                              # (the existing checks)
            if "clip_skip" in values:                 # 2. its model-independent check, naming it
                values["clip_skip"] = as_int(values["clip_skip"], "clip_skip", 1)
            return values

    # 3. checks that need the model go to the pipeline's plan() (does this family have the
    #    component the field needs?), once; 4. the CLI flag fills the same field name;
    # 5. a field A1111 writes into its PNG text goes to GenerationParameters too.

A family whose requests carry fields the others do not (SDXL's original/target size) subclasses:
``class XLRequest(GenerationRequest)`` with its fields and a ``checked`` that calls ``super()``,
and its pipeline sets ``request_class = XLRequest``; a base request handed to that pipeline is
re-created as the subclass (the new fields take their defaults).
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from sdkit.errors import InputError, OptionError, did_you_mean
from sdkit.pipelines.control_units import ControlUnit, control_units
from sdkit.pipelines.imaging.hires_plan import canonical_upscaler
from sdkit.pipelines.imaging.images import open_init_image
from sdkit.pipelines.imaging.masks import open_mask
from sdkit.plugins import get_plugins
from sdkit.schedulers import resolve

if TYPE_CHECKING:
    from PIL import Image

    from sdkit.schedulers import Scheduler

StepCallback = Callable[[int, int, np.ndarray], None]  # (step index, total steps, latents)
OUTPUT_TYPES = ("pil", "np")
PROMPT_WEIGHTINGS = ("none", "a1111")
R = TypeVar("R", bound="GenerationRequest")


def as_int(value: Any, what: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (bools refused), or an InputError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise InputError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_float(value: Any, what: str) -> float:
    """``value`` as a finite float, or an InputError naming ``what``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    return number


def as_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _size(value: Any, what: str) -> int | None:
    """None (the model's default) or an int >= 8 and a multiple of 8: every SD-class VAE
    downsamples by 8 or more; a pipeline whose factor is larger checks its own multiple."""
    if value is None:
        return None
    size = as_int(value, what, 8)
    if size % 8:
        raise InputError(f"{what} must be a multiple of 8, got {size}")
    return size


@dataclass(frozen=True, eq=False)
class GenerationRequest:
    """One txt2img / img2img generation. Build it with ``create`` (checks every field).

    Inpainting: mask (uint8 [H, W], 255 = repaint; ``create`` opens a PIL image, a path or an
    array) needs an init_image of the same size; mask_blur (A1111's, in pixels; 0 = none, A1111's
    default is 4), inpaint_full_res (A1111's "only masked": crop around the mask grown by
    inpaint_full_res_padding, generate the crop at width x height, paste it back), paste_back
    (blend the generated pixels into the original under the blurred mask as A1111 always does;
    None: only with inpaint_full_res, as diffusers), inpainting_fill (A1111's "masked content": 1
    original, the default and diffusers'; 0 fill, 2 latent noise, 3 latent nothing; see
    ``sdkit.pipelines.features.inpainting``). control: ControlNet units
    (``sdkit.pipelines.control_units.ControlUnit``; tuples ``(image, model, scale, start, end,
    preprocessor)`` or dicts are converted).

    prompt, negative_prompt: text. seed: image ``i`` uses ``seed + i`` (``create`` draws a random
    one when none is given). width, height: multiples of 8, None for the model's default (img2img:
    the init image's size rounded down to a multiple of 8). steps, guidance_scale (CFG when > 1).
    sampler, schedule: canonical names (``create`` resolves "DPM++ 2M Karras" to ("dpmpp_2m",
    "karras")). sampler_options: the sampler's own settings (``eta`` for DDIM, ``s_noise``
    for the ancestral and SDE samplers: ``Scheduler.option_defaults``; another is an OptionError).
    init_image: RGB PIL image (``create`` opens a path or an array) or None for txt2img;
    strength in (0, 1] for img2img. num_images. latents: replaces the initial noise draw (float32
    ``[num_images, channels, height/f, width/f]``). callback(step, total, latents) after each step.
    output_type: "pil" (PIL images with A1111 parameters) or "np" (``[N, H, W, 3]`` in [0, 1]).
    prompt_weighting: "none" (diffusers: the text as written, cut at 75 tokens) or "a1111"
    (A1111: ``(word:1.2)`` emphasis, 75-token chunks concatenated, ``BREAK``; see
    ``sdkit.pipelines.text.text_encoding``). clip_skip: A1111's "Clip skip" (``CLIP_stop_at_last_layers``):
    1 the text encoder's last layer, 2 the one before it... (``text_encoding.with_skipped_layers``).
    vae_tiling: VAE decode and encode in overlapping tiles of
    vae_tile_size image pixels (a multiple of 8; overlap a quarter of it), blended seam-free
    (``sdkit.pipelines.stages.vae``): large images in bounded memory.

    Hires fix (txt2img only), A1111's txt2img API fields: enable_hr, hr_scale (or hr_resize_x /
    hr_resize_y), hr_upscaler (``sdkit.pipelines.imaging.hires_plan.UPSCALERS``: "Latent", "Latent
    (nearest)", "Latent (nearest-exact)", "Lanczos", "Nearest"), hr_second_pass_steps (0: steps),
    denoising_strength (the second pass's; img2img's is ``strength``), hr_sampler / hr_schedule
    (A1111's hr_sampler_name / hr_scheduler), hr_prompt, hr_negative_prompt, hr_guidance_scale
    (Forge's hr_cfg): the second pass's own (None: the first pass's). See ``sdkit.pipelines.features.hires_fix``.

    Face restoration (A1111's ``restore_faces``, after decoding, before the PNG is written):
    restore_faces, a GFPGAN or CodeFormer ``.safetensors`` file, or A1111's name ("GFPGAN",
    "CodeFormer") of one in ``$SDKIT_FACE_DIR``, with the detector and parser files next to it or
    there; codeformer_weight, CodeFormer's fidelity ``w`` in [0, 1] (None: 0.5, A1111's
    ``code_former_weight``). See ``sdkit.pipelines.stages.faces``.
    """

    prompt: str
    negative_prompt: str = ""
    seed: int = 0
    width: int | None = None
    height: int | None = None
    steps: int = 20
    guidance_scale: float = 7.5
    sampler: str = "euler_a"
    schedule: str = "normal"
    sampler_options: Mapping[str, float] = field(default_factory=dict)
    init_image: Image.Image | None = None
    strength: float = 0.8
    mask: np.ndarray | None = None
    mask_blur: int = 0
    inpaint_full_res: bool = False
    inpaint_full_res_padding: int = 32
    paste_back: bool | None = None
    inpainting_fill: int = 1
    control: tuple[ControlUnit, ...] = ()
    num_images: int = 1
    latents: np.ndarray | None = None
    callback: StepCallback | None = None
    output_type: str = "pil"
    prompt_weighting: str = "none"
    clip_skip: int = 1
    vae_tiling: bool = False
    vae_tile_size: int = 512
    enable_hr: bool = False
    hr_scale: float = 2.0
    hr_upscaler: str = "Latent"
    hr_second_pass_steps: int = 0
    hr_resize_x: int = 0
    hr_resize_y: int = 0
    denoising_strength: float = 0.7
    hr_sampler: str | None = None
    hr_schedule: str | None = None
    hr_prompt: str | None = None
    hr_negative_prompt: str | None = None
    hr_guidance_scale: float | None = None
    restore_faces: str | None = None
    codeformer_weight: float | None = None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def create(cls: type[R], prompt: str, **fields: Any) -> R:
        """A checked request; keyword names are the fields'. Unknown names are an OptionError."""
        known = cls.field_names()
        for name in fields:
            if name not in known:
                raise OptionError(f"unknown generation option {name!r}{did_you_mean(name, known)}")
        return cls(**cls.checked({"prompt": prompt, **fields}))

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Each given field checked and made canonical (fields not given keep their defaults).
        Subclasses call ``super().checked(values)`` and then check their own fields."""
        out = dict(values)
        out["prompt"] = as_text(values["prompt"], "prompt")
        if "negative_prompt" in values:
            out["negative_prompt"] = as_text(values["negative_prompt"] or "", "negative_prompt")
        seed = values.get("seed")
        out["seed"] = secrets.randbits(32) if seed is None else _seed(seed)
        for what in ("width", "height"):
            if what in values:
                out[what] = _size(values[what], what)
        for what, minimum in (("steps", 1), ("num_images", 1)):
            if what in values:
                out[what] = as_int(values[what], what, minimum)
        if "guidance_scale" in values:
            out["guidance_scale"] = as_float(values["guidance_scale"], "guidance_scale")
        out.update(_sampler_fields(values))
        out.update(_img2img_fields(values))
        out.update(_inpaint_fields(values, out))
        out.update(_control_fields(values, out))
        out.update(_tiling_fields(values))
        out.update(_hires_fields(values, out))
        out.update(_face_fields(values))
        if values.get("latents") is not None:
            out["latents"] = np.asarray(values["latents"])
        callback = values.get("callback")
        if callback is not None and not callable(callback):
            raise InputError(f"callback must be callable, got {type(callback).__name__}")
        if "output_type" in values and values["output_type"] not in OUTPUT_TYPES:
            raise InputError(f"output_type must be 'pil' or 'np', not {values['output_type']!r}")
        if "clip_skip" in values:
            out["clip_skip"] = as_int(values["clip_skip"], "clip_skip", 1)
        if "prompt_weighting" in values and values["prompt_weighting"] not in PROMPT_WEIGHTINGS:
            raise InputError(
                f"prompt_weighting must be one of {', '.join(PROMPT_WEIGHTINGS)}, not {values['prompt_weighting']!r}"
            )
        return out

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes``, checked like ``create`` (``dataclasses.replace`` skips the
        checks). A new ``sampler`` without a ``schedule`` takes the schedule its name implies."""
        current = {name: getattr(self, name) for name in self.field_names()}
        if "sampler" in changes and "schedule" not in changes:
            current["schedule"] = None
        return type(self).create(**{**current, **changes})

    @property
    def img2img(self) -> bool:
        return self.init_image is not None

    @property
    def inpainting(self) -> bool:
        return self.mask is not None


def _face_fields(values: dict[str, Any]) -> dict[str, Any]:
    """``restore_faces`` (a path or A1111's restorer name) and ``codeformer_weight`` in [0, 1]."""
    out: dict[str, Any] = {}
    model = values.get("restore_faces")
    if model is not None:
        if isinstance(model, os.PathLike):
            model = os.fspath(model)
        if not isinstance(model, str) or not model:
            raise InputError(f"restore_faces must be a face restorer file or name, got {model!r}")
        out["restore_faces"] = model
    weight = values.get("codeformer_weight")
    if weight is not None:
        weight = as_float(weight, "codeformer_weight")
        if not 0.0 <= weight <= 1.0:
            raise InputError(f"codeformer_weight must be in [0, 1], got {weight}")
        if model is None:
            raise InputError("codeformer_weight needs restore_faces (a CodeFormer file)")
        out["codeformer_weight"] = weight
    return out


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"seed must be an integer, not {type(value).__name__}")
    return int(value)


def _sampler_fields(values: dict[str, Any]) -> dict[str, str]:
    """The canonical sampler and schedule, resolved once; a schedule the sampler does not
    support is refused here rather than when the scheduler is built."""
    sampler, schedule = resolve(values.get("sampler", "euler_a"), values.get("schedule"))
    cls = get_plugins().schedulers.get(sampler)
    supported = tuple(getattr(cls, "schedules", (schedule,)))
    if schedule not in supported:
        raise OptionError(
            f"sampler {sampler!r} does not support schedule {schedule!r}; use one of {', '.join(supported)}"
        )
    out: dict[str, Any] = {"sampler": sampler, "schedule": schedule}
    if values.get("sampler_options"):
        out["sampler_options"] = _sampler_options(sampler, values["sampler_options"], cls)
    return out


def _sampler_options(sampler: str, given: Any, cls: Any) -> dict[str, float]:
    """The sampler options a request gives, each one the sampler takes, as a finite float."""
    if not isinstance(given, Mapping):
        raise InputError(f"sampler_options must be a mapping of option names to numbers, not {type(given).__name__}")
    takes = dict(getattr(cls, "option_defaults", {}))
    options: dict[str, float] = {}
    for key, value in given.items():
        if key not in takes:
            raise OptionError(f"sampler {sampler!r} has no option {key!r} (its options: {', '.join(takes) or 'none'})")
        options[str(key)] = as_float(value, f"sampler option {key}")
    return options


def _img2img_fields(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "strength" in values:
        out["strength"] = as_float(values["strength"], "strength")
    if values.get("init_image") is not None:
        out["init_image"] = open_init_image(values["init_image"])
        strength = out.get("strength", 0.8)
        if not 0.0 < strength <= 1.0:
            raise InputError(f"strength must be in (0, 1], got {values['strength']!r}")
    return out


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def _inpaint_fields(values: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
    """The mask and A1111's inpainting options; a mask needs an init image of its size and
    something to repaint, and the options need a mask."""
    out: dict[str, Any] = {}
    for what in ("mask_blur", "inpaint_full_res_padding"):
        if what in values:
            out[what] = as_int(values[what], what, 0)
    if "inpaint_full_res" in values:
        out["inpaint_full_res"] = _flag(values["inpaint_full_res"], "inpaint_full_res")
    if values.get("paste_back") is not None:
        out["paste_back"] = _flag(values["paste_back"], "paste_back")
    if "inpainting_fill" in values:
        out["inpainting_fill"] = as_int(values["inpainting_fill"], "inpainting_fill", 0)
        if out["inpainting_fill"] > 3:
            raise InputError(
                f"inpainting_fill must be 0 (fill), 1 (original), 2 (latent noise) or 3 (latent nothing), "
                f"got {out['inpainting_fill']}"
            )
    if values.get("mask") is None:
        if out.get("inpainting_fill", 1) != 1:
            raise InputError("inpainting_fill is an inpainting option: it needs a mask")
        given = [n for n in ("mask_blur", "inpaint_full_res", "paste_back") if out.get(n)]
        if given:
            raise InputError(f"{given[0]} is an inpainting option: it needs a mask")
        return out
    mask = open_mask(values["mask"])
    image = checked.get("init_image")
    if image is None:
        raise InputError("a mask needs an init_image: the image to inpaint")
    if (mask.shape[1], mask.shape[0]) != image.size:
        raise InputError(
            f"the mask is {mask.shape[1]}x{mask.shape[0]} but the init image is {image.width}x{image.height}; "
            "they must be the same size"
        )
    if not (mask >= 128).any():
        raise InputError("the mask selects nothing to repaint: no pixel is >= 128 (white repaints, black keeps)")
    out["mask"] = mask
    return out


def _control_fields(values: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
    """ControlNet units; with ``inpaint_full_res`` each control image is cropped like the init
    image, so it must have the init image's size."""
    if "control" not in values:
        return {}
    units = control_units(values["control"])
    image = checked.get("init_image")
    if units and checked.get("inpaint_full_res") and image is not None:
        for unit in units:
            if unit.size != image.size:
                raise InputError(
                    f"with inpaint_full_res a control image is cropped like the init image, so it must be "
                    f"{image.width}x{image.height}, not {unit.size[0]}x{unit.size[1]}"
                )
    return {"control": units}


def _tiling_fields(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "vae_tiling" in values:
        out["vae_tiling"] = _flag(values["vae_tiling"], "vae_tiling")
    if "vae_tile_size" in values:
        out["vae_tile_size"] = _size(values["vae_tile_size"], "vae_tile_size") or 512
        if out["vae_tile_size"] < 16:
            raise InputError(f"vae_tile_size must be at least 16 pixels, got {out['vae_tile_size']}")
    return out


HIRES_DEFAULTS = {
    "hr_scale": 2.0,
    "hr_upscaler": "Latent",
    "hr_second_pass_steps": 0,
    "hr_resize_x": 0,
    "hr_resize_y": 0,
    "denoising_strength": 0.7,
    "hr_sampler": None,
    "hr_schedule": None,
    "hr_prompt": None,
    "hr_negative_prompt": None,
    "hr_guidance_scale": None,
}


def _hires_fields(values: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
    """A1111's hires-fix fields; they need ``enable_hr``, which needs txt2img (no init image)."""
    out: dict[str, Any] = {}
    if "enable_hr" in values:
        out["enable_hr"] = _flag(values["enable_hr"], "enable_hr")
    for what in ("hr_second_pass_steps", "hr_resize_x", "hr_resize_y"):
        if what in values:
            out[what] = as_int(values[what], what, 0)
    for what in ("hr_scale", "denoising_strength"):
        if what in values:
            out[what] = as_float(values[what], what)
    if "hr_upscaler" in values:
        out["hr_upscaler"] = canonical_upscaler(as_text(values["hr_upscaler"], "hr_upscaler"))
    if values.get("hr_guidance_scale") is not None:
        out["hr_guidance_scale"] = as_float(values["hr_guidance_scale"], "hr_guidance_scale")
    for what in ("hr_prompt", "hr_negative_prompt"):  # "" as None: the first pass's, as A1111
        if values.get(what) is not None:
            out[what] = as_text(values[what], what) or None
    if values.get("hr_sampler") is not None or values.get("hr_schedule") is not None:
        sampler = values.get("hr_sampler") or values.get("sampler", "euler_a")
        second = _sampler_fields({"sampler": sampler, "schedule": values.get("hr_schedule")})
        out["hr_sampler"], out["hr_schedule"] = second["sampler"], second["schedule"]
    if not out.get("enable_hr"):
        changed = [name for name, default in HIRES_DEFAULTS.items() if out.get(name, default) != default]
        if changed:
            raise InputError(f"{changed[0]} is a hires fix option: it needs enable_hr=True")
        return out
    if checked.get("init_image") is not None:
        raise InputError("hires fix (enable_hr) is for txt2img: it cannot start from an init_image")
    if not 0.0 < out.get("denoising_strength", 0.7) <= 1.0:
        raise InputError(f"denoising_strength must be in (0, 1], got {values['denoising_strength']!r}")
    if not out.get("hr_resize_x") and not out.get("hr_resize_y") and out.get("hr_scale", 2.0) < 1.0:
        raise InputError(f"hr_scale must be at least 1, got {values['hr_scale']!r}")
    return out


@dataclass
class GenerationPlan:
    """A request bound to a pipeline: the concrete size, the init image as VAE input, the latent
    shape, the per-image seeds and the scheduler with its timesteps set. ``parameters``: PNG
    labels the stages add as they run (A1111's names, e.g. ``Pad conds``), written after the
    common ones."""

    request: GenerationRequest
    width: int
    height: int
    latent_shape: tuple[int, ...]
    seeds: list[int]
    scheduler: Scheduler
    image: np.ndarray | None = None  # img2img: [1, 3, H, W] in [-1, 1]
    parameters: dict[str, str] = field(default_factory=dict)
