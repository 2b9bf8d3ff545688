"""``GenerationRequest``: one generation, checked once, in canonical form.

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
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from sdkit.errors import InputError, OptionError, did_you_mean
from sdkit.pipelines.images import open_init_image
from sdkit.plugins import get_plugins
from sdkit.schedulers import resolve

if TYPE_CHECKING:
    from PIL import Image

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

    prompt, negative_prompt: text. seed: image ``i`` uses ``seed + i`` (``create`` draws a random
    one when none is given). width, height: multiples of 8, None for the model's default (img2img:
    the init image's size rounded down to a multiple of 8). steps, guidance_scale (CFG when > 1).
    sampler, schedule: canonical names (``create`` resolves "DPM++ 2M Karras" to ("dpmpp_2m",
    "karras")). init_image: RGB PIL image (``create`` opens a path or an array) or None for txt2img;
    strength in (0, 1] for img2img. num_images. latents: replaces the initial noise draw (float32
    ``[num_images, channels, height/f, width/f]``). callback(step, total, latents) after each step.
    output_type: "pil" (PIL images with A1111 parameters) or "np" (``[N, H, W, 3]`` in [0, 1]).
    prompt_weighting: "none" (diffusers: the text as written, cut at 75 tokens) or "a1111"
    (A1111: ``(word:1.2)`` emphasis, 75-token chunks concatenated, ``BREAK``; see
    ``sdkit.pipelines.text_encoding``).
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
    init_image: Image.Image | None = None
    strength: float = 0.8
    num_images: int = 1
    latents: np.ndarray | None = None
    callback: StepCallback | None = None
    output_type: str = "pil"
    prompt_weighting: str = "none"

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
        if values.get("latents") is not None:
            out["latents"] = np.asarray(values["latents"])
        callback = values.get("callback")
        if callback is not None and not callable(callback):
            raise InputError(f"callback must be callable, got {type(callback).__name__}")
        if "output_type" in values and values["output_type"] not in OUTPUT_TYPES:
            raise InputError(f"output_type must be 'pil' or 'np', not {values['output_type']!r}")
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
    return {"sampler": sampler, "schedule": schedule}


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
