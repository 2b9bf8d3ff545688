"""A1111's generation fields beyond the prompt and the sampler, each mapped onto the pipeline's
own feature (the ``pipeline.generate`` keyword the CLI fills for the same thing):

- img2img ``mask``: ``mask_blur`` (or ``mask_blur_x``/``_y``), ``inpaint_full_res`` and its
  ``_padding``, ``inpainting_mask_invert`` -> ``mask``, ``mask_blur``, ``inpaint_full_res``,
  ``inpaint_full_res_padding``, ``inpainting_fill``, with ``paste_back`` on (A1111 always
  overlays the original outside the mask).
- ``enable_hr`` and the ``hr_*`` fields -> the pipeline's hires fix, ``hr_sampler_name``,
  ``hr_scheduler``, ``hr_prompt``, ``hr_negative_prompt`` too (empty or "Use same ...": the
  first pass's, as A1111), Forge's ``hr_cfg``; ``hr_checkpoint_name`` when it asks for the
  first pass's model.
- ``eta``, ``s_noise`` -> ``sampler_options`` where the sampler takes them.
- the ControlNet extension's ``alwayson_scripts.controlnet.args`` units -> ``control`` units.

Each function returns the keyword arguments and what it could not honour (field -> reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.errors import InputError
from sdkit.plugins import get_plugins
from sdkit.schedulers import resolve
from sdkit_serve.extra_networks import controlnet_folders, controlnet_name
from sdkit_serve.schemas import schedule_name

if TYPE_CHECKING:
    from PIL import Image

SAME = (None, "", "Use same sampler", "Use same scheduler", "Use same checkpoint")


@dataclass
class Mapped:
    """Keyword arguments for ``pipeline.generate`` and the fields left undone, with reasons."""

    generate: dict[str, Any] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    controlnets: dict[str, Path] = field(default_factory=dict)  # ControlNets the units use

    def merge(self, other: Mapped) -> Mapped:
        self.generate.update(other.generate)
        self.ignored.update(other.ignored)
        self.controlnets.update(other.controlnets)
        return self


def inpaint_fields(payload: Any, mask_image: Image.Image) -> Mapped:
    """The inpainting keywords of an img2img request with a mask (already decoded)."""
    from PIL import ImageOps

    mapped = Mapped()
    grey = mask_image.convert("L")
    if payload.inpainting_mask_invert:
        grey = ImageOps.invert(grey)
    blur_x, blur_y = payload.mask_blur_x, payload.mask_blur_y
    if payload.mask_blur is not None:  # A1111: mask_blur sets both
        blur_x = blur_y = payload.mask_blur
    if blur_x != blur_y:
        mapped.ignored["mask_blur_y"] = f"one blur for both axes: mask_blur_x ({blur_x}) is used"
    mapped.generate.update(
        mask=np.asarray(grey, dtype=np.uint8),
        mask_blur=int(blur_x),
        inpaint_full_res=bool(payload.inpaint_full_res),
        inpaint_full_res_padding=int(payload.inpaint_full_res_padding),
        paste_back=True,
        inpainting_fill=int(payload.inpainting_fill),
    )
    return mapped


def hires_fields(payload: Any, sampler: str, schedule: str | None) -> Mapped:
    """The hires-fix keywords of a txt2img request with ``enable_hr``."""
    mapped = Mapped()
    if not payload.enable_hr:
        return mapped
    strength = payload.denoising_strength
    mapped.generate.update(
        enable_hr=True,
        hr_scale=float(payload.hr_scale),
        hr_upscaler=payload.hr_upscaler or "Latent",  # A1111's default latent upscale mode
        hr_second_pass_steps=int(payload.hr_second_pass_steps),
        hr_resize_x=int(payload.hr_resize_x),
        hr_resize_y=int(payload.hr_resize_y),
        denoising_strength=0.7 if strength is None else float(strength),
    )
    extra = payload.model_extra or {}
    for name in ("hr_sampler_name", "hr_scheduler", "hr_prompt", "hr_negative_prompt", "hr_checkpoint_name"):
        if extra.get(name) is not None and not isinstance(extra[name], str):
            raise InputError(f"{name} must be a string, got {type(extra[name]).__name__}")
    sampler_name, scheduler = extra.get("hr_sampler_name"), extra.get("hr_scheduler")
    if sampler_name not in SAME or scheduler not in SAME:
        mapped.generate["hr_sampler"] = sampler_name if sampler_name not in SAME else sampler
        mapped.generate["hr_schedule"] = schedule_name(scheduler) if scheduler not in SAME else schedule
    for name in ("hr_prompt", "hr_negative_prompt"):
        if extra.get(name) not in (None, ""):
            mapped.generate[name] = extra[name]
    if extra.get("hr_cfg") not in (None, payload.cfg_scale):  # Forge's: the second pass's CFG
        mapped.generate["hr_guidance_scale"] = extra["hr_cfg"]
    if extra.get("hr_checkpoint_name") not in SAME:
        mapped.ignored["hr_checkpoint_name"] = "the second pass runs on the loaded model"
    modules = extra.get("hr_additional_modules")
    if modules not in (None, [], ["Use same choices"]):
        mapped.ignored["hr_additional_modules"] = "additional modules are not supported"
    return mapped


def sampler_fields(payload: Any, sampler: str, schedule: str | None) -> Mapped:
    """``eta`` and ``s_noise`` as the sampler's options, where it takes them. Where it does not,
    a value is reported only if it would change A1111's image: ``eta`` for an ancestral or SDE
    sampler other than 1 (A1111's default there), ``s_noise`` other than 1 for one that draws
    noise. A deterministic sampler ignores both in A1111 too."""
    mapped = Mapped()
    canonical, _ = resolve(sampler, schedule)
    cls = get_plugins().schedulers.get(canonical)
    takes = dict(getattr(cls, "option_defaults", {}))
    stochastic = bool(getattr(cls, "needs_noise", False))
    # "DDIM Karras" runs ComfyUI's ddim (no eta): an eta the schedule-less DDIM would use is reported
    base = get_plugins().schedulers.get(str(getattr(cls, "schedule_variant_of", "")))
    base_takes = dict(getattr(base, "option_defaults", {})) if base is not None else {}
    options: dict[str, float] = {}
    for name in ("eta", "s_noise"):
        value = getattr(payload, name)
        if value is None:
            continue
        if name in takes:
            options[name] = float(value)
        elif (stochastic and float(value) != 1.0) or (name in base_takes and float(value) != base_takes[name]):
            has = ", ".join(takes) or "none"
            mapped.ignored[name] = f"the {canonical} sampler has no {name} option (its options: {has})"
    if options:
        mapped.generate["sampler_options"] = options
    return mapped


# -- the ControlNet extension -----------------------------------------------------------------

# The extension's module names -> sdkit's preprocessor and how threshold_a/b map onto its
# parameters (the extension's sliders for that module).
MODULES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "none": (None, ()),
    "canny": ("canny", ("low_threshold", "high_threshold")),
    "invert": ("invert", ()),
    "invert (from white bg & black line)": ("invert", ()),
    "threshold": ("threshold", ("level",)),
    "tile_resample": ("tile_resample", ("factor",)),
    "blur_gaussian": ("blur_gaussian", ("sigma",)),
    "scribble_xdog": ("scribble_xdog", ("level",)),
}
INTEGER_PARAMS = ("low_threshold", "high_threshold", "level")
RESIZE_MODES = {0: "Just Resize", 1: "Crop and Resize", 2: "Resize and Fill"}
CONTROL_MODES = {0: "Balanced", 1: "My prompt is more important", 2: "ControlNet is more important"}


def preprocessor_of(module: Any, threshold_a: Any = None, threshold_b: Any = None) -> tuple[str | None, dict[str, Any]]:
    """The extension's ``module`` with its ``threshold_a``/``_b`` as sdkit's preprocessor and
    parameters (a threshold of -1 or None: the preprocessor's default)."""
    key = "none" if module in (None, "", "None") else str(module).strip().lower()
    if key not in MODULES:
        raise InputError(f"unknown ControlNet module {module!r}; this server has: {', '.join(MODULES)}")
    name, params = MODULES[key]
    values: dict[str, Any] = {}
    for param, value in zip(params, (threshold_a, threshold_b), strict=False):
        if value is None or value == -1:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise InputError(f"ControlNet module {module!r}: thresholds must be finite numbers, got {value!r}")
        values[param] = int(value) if param in INTEGER_PARAMS else float(value)
    return name, values


def _choice(value: Any, names: dict[int, str], default: int) -> int:
    """An extension enum given as its index or its label."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool) and value in names:
        return value
    for index, label in names.items():
        if str(value).strip().lower() == label.lower():
            return index
    raise InputError(f"unknown value {value!r}; use one of {', '.join(names.values())}")


@dataclass(frozen=True)
class UnitContext:
    decode: Any  # (base64 text, what) -> RGB PIL image
    controlnet_dir: Path | None
    init_image: Image.Image | None
    size: tuple[int, int] | None  # the generation's width and height (None: the model's default)


def controlnet_fields(scripts: Any, context: UnitContext) -> Mapped:
    """``alwayson_scripts``: the ControlNet extension's units as ``control``; other scripts are
    reported (sdkit runs no A1111 extension code)."""
    mapped = Mapped()
    if not scripts:
        return mapped
    if not isinstance(scripts, dict):
        raise InputError("alwayson_scripts must be an object of script name -> {args: [...]}")
    units: list[dict[str, Any]] = []
    for script, body in scripts.items():
        if str(script).lower() != "controlnet":
            mapped.ignored[f"alwayson_scripts.{script}"] = "A1111 extension scripts other than ControlNet are not run"
            continue
        args = body.get("args", []) if isinstance(body, dict) else None
        if not isinstance(args, list):
            raise InputError("alwayson_scripts.controlnet.args must be a list of ControlNet units")
        known = controlnet_folders(context.controlnet_dir)
        for index, unit in enumerate(args):
            made = _unit(unit, index, known, context, mapped)
            if made is not None:
                units.append(made)
    if units:
        mapped.generate["control"] = units
    return mapped


def _unit(unit: Any, index: int, known: dict[str, Path], context: UnitContext, mapped: Mapped) -> dict[str, Any] | None:
    """One extension unit as an sdkit unit dict (None: a disabled or empty unit)."""
    where = f"alwayson_scripts.controlnet.args[{index}]"
    if not isinstance(unit, dict):
        raise InputError(f"{where} must be an object (a ControlNet unit)")
    if unit.get("enabled", True) is False:
        return None
    model = unit.get("model")
    if model in (None, "", "None", "none"):
        mapped.ignored[where] = "the unit names no ControlNet model: skipped"
        return None
    name = controlnet_name(model, known)
    mapped.controlnets[name] = known[name]
    preprocessor, params = preprocessor_of(unit.get("module"), unit.get("threshold_a"), unit.get("threshold_b"))
    image = _unit_image(unit, where, context)
    resize = _choice(unit.get("resize_mode"), RESIZE_MODES, 1)  # the extension's default: Crop and Resize
    size = context.size
    if resize != 0 and (size is None or image.width * size[1] != image.height * size[0]):
        mapped.ignored[f"{where}.resize_mode"] = (
            f"{RESIZE_MODES[resize]!r} is not supported: the control image is stretched to the generation size "
            "(Just Resize), which is the same when their aspect ratios agree"
        )
    control_mode = _choice(unit.get("control_mode"), CONTROL_MODES, 0)
    if control_mode != 0:
        mapped.ignored[f"{where}.control_mode"] = f"{CONTROL_MODES[control_mode]!r} is not supported: Balanced is used"
    if unit.get("pixel_perfect") or (preprocessor and unit.get("processor_res") not in (None, -1)):
        mapped.ignored[f"{where}.processor_res"] = "preprocessors run at the control image's own size"
    return {
        "image": image,
        "model": name,
        "scale": unit.get("weight", 1.0),
        "start": unit.get("guidance_start", 0.0),
        "end": unit.get("guidance_end", 1.0),
        "preprocessor": preprocessor,
        "preprocessor_params": params,
    }


def _unit_image(unit: dict[str, Any], where: str, context: UnitContext) -> Image.Image:
    """A unit's image (``image`` or the older ``input_image``; ``{"image": ..., "mask": ...}``
    too); without one, img2img's init image, as the extension does."""
    image = unit.get("image", unit.get("input_image"))
    if isinstance(image, dict):
        if image.get("mask"):
            raise InputError(f"{where}.image.mask: ControlNet masks are not supported")
        image = image.get("image")
    if image in (None, ""):
        if context.init_image is None:
            raise InputError(f"{where} has no image (txt2img needs one per ControlNet unit)")
        return context.init_image
    decoded: Image.Image = context.decode(image, f"{where}.image")
    return decoded
