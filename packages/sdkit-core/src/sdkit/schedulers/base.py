"""The scheduler contract: a diffusers-shaped, numpy-only sampler object.

A pipeline drives every scheduler the same way, exactly like a diffusers pipeline::

    sched = create_scheduler("euler_a", schedule="karras", config=scheduler_config)
    sched.set_timesteps(steps, strength=1.0)
    latents = noise * sched.init_noise_sigma            # txt2img
    # img2img: latents = sched.add_noise(image_latents, noise, sched.timesteps[0])
    for t in sched.timesteps:
        model_in = sched.scale_model_input(latents, t)
        model_out = unet(model_in, t)                     # after classifier-free guidance
        latents = sched.step(model_out, t, latents, noise=draw)

``step`` advances an internal counter (like diffusers' ``step_index``); the ``timestep``
argument is checked against it so a pipeline that skips or repeats a step gets a clear
error instead of silently wrong images.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError, OptionError
from sdkit.limits import check_bytes
from sdkit.schedulers import noise_schedule

NoiseFn = Callable[[tuple[int, ...]], NDArray[np.float32]]
"""Draws standard-normal float32 noise of a shape; samplers that inject noise call it."""

SCHEDULES = (
    "normal",
    "karras",
    "exponential",
    "sgm_uniform",
    "simple",
    "ddim_uniform",
    "beta",
    # sdkit.schedulers.sigma_schedules
    "align_your_steps",
    "align_your_steps_sdxl",
    "align_your_steps_svd",
    "kl_optimal",
    "linear_quadratic",
)
PREDICTION_TYPES = ("epsilon", "v_prediction", "flow")

# Stable Diffusion 1.x's scheduler_config.json (what ``config=None`` means).
SD15_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "trained_betas": None,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "clip_sample": False,
}

# diffusers config keys whose non-default values change results in ways not implemented here.
_UNSUPPORTED_SETTINGS: dict[str, tuple[object, ...]] = {
    "rescale_betas_zero_snr": (False, None),
    "thresholding": (False, None),
    "interpolation_type": ("linear", None),
    "timestep_type": ("discrete", None),
    "final_sigmas_type": ("zero", None),
    "use_beta_sigmas": (False, None),
    "use_lu_lambdas": (False, None),
    "use_flow_sigmas": (False, None),
    "variance_type": (None, "fixed_small"),  # DDPM's default; no sampler here reads it
}


@dataclass(frozen=True)
class SchedulerConfig:
    """The parts of a diffusers ``scheduler_config.json`` that schedulers here use."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.0001
    beta_end: float = 0.02
    beta_schedule: str = "linear"
    trained_betas: tuple[float, ...] | None = None
    prediction_type: str = "epsilon"
    steps_offset: int = 0
    timestep_spacing: str = "linspace"
    clip_sample: bool = False
    clip_sample_range: float = 1.0
    set_alpha_to_one: bool = True
    sigma_min: float | None = None
    sigma_max: float | None = None
    original_inference_steps: int = 50
    timestep_scaling: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], defaults: Mapping[str, Any]) -> SchedulerConfig:
        """Build from a diffusers config dict; keys it lacks take ``defaults`` (the diffusers
        class's own defaults), then this dataclass's. Unknown keys are kept in ``extra``."""
        merged = {**defaults, **{k: v for k, v in data.items() if not k.startswith("_")}}
        for key, allowed in _UNSUPPORTED_SETTINGS.items():
            if key in merged and merged[key] not in allowed:
                raise OptionError(f"scheduler config {key}={merged[key]!r} is not supported by sdkit's schedulers")
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        for key in known & merged.keys():
            values[key] = _checked_value(key, merged[key])
        config = cls(**values, extra={k: v for k, v in merged.items() if k not in known})
        config._check()
        return config

    def _check(self) -> None:
        if self.num_train_timesteps < 2:
            raise OptionError(f"num_train_timesteps must be an integer >= 2, got {self.num_train_timesteps!r}")
        # the schedule's arrays (betas, alphas, their products, sigmas...) are sized by these
        # numbers from a file: checked against the memory budget before any is made
        length = max(self.num_train_timesteps, self.original_inference_steps, len(self.trained_betas or ()))
        check_bytes(length * SCHEDULE_BYTES_PER_STEP, f"the sampler's schedule ({length} training timesteps)")
        if self.prediction_type not in PREDICTION_TYPES:
            raise OptionError(
                f"prediction_type {self.prediction_type!r} is not supported; use one of {', '.join(PREDICTION_TYPES)}"
            )
        if self.timestep_spacing not in noise_schedule.TIMESTEP_SPACINGS:
            raise OptionError(
                f"timestep_spacing {self.timestep_spacing!r} is not supported; "
                f"use one of {', '.join(noise_schedule.TIMESTEP_SPACINGS)}"
            )


SCHEDULE_BYTES_PER_STEP = 64  # about eight float64 arrays of num_train_timesteps entries
_INT_KEYS = ("num_train_timesteps", "steps_offset", "original_inference_steps")
_FLOAT_KEYS = ("beta_start", "beta_end", "clip_sample_range", "timestep_scaling")
_OPTIONAL_FLOAT_KEYS = ("sigma_min", "sigma_max")
_BOOL_KEYS = ("clip_sample", "set_alpha_to_one")
_STR_KEYS = ("beta_schedule", "prediction_type", "timestep_spacing")


def _checked_value(key: str, value: Any) -> Any:
    """``value`` if it has the type ``key`` needs (JSON numbers accepted), else OptionError."""
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if key in _INT_KEYS and number and float(value).is_integer():
        return int(value)
    if (key in _FLOAT_KEYS or key in _OPTIONAL_FLOAT_KEYS) and number and np.isfinite(value):
        return float(value)
    if key in _OPTIONAL_FLOAT_KEYS and value is None:
        return None
    if (key in _BOOL_KEYS and isinstance(value, (bool, np.bool_))) or (key in _STR_KEYS and isinstance(value, str)):
        return value
    if key == "trained_betas":
        if value is None:
            return None
        try:
            return tuple(float(b) for b in value)
        except (TypeError, ValueError):
            pass
    raise OptionError(f"scheduler config {key}={value!r} has the wrong type")


# Allowed range of each sampler option.
_OPTION_RANGES: dict[str, tuple[float, float]] = {"eta": (0.0, 1.0), "s_noise": (0.0, 10.0)}


def _checked_options(sampler: str, defaults: Mapping[str, float], given: Mapping[str, Any]) -> dict[str, float]:
    """``defaults`` updated with ``given``; OptionError for an option the sampler lacks or a bad value."""
    values = dict(defaults)
    for key, value in given.items():
        if key not in defaults:
            takes = ", ".join(defaults) or "none"
            raise OptionError(f"sampler {sampler!r} has no option {key!r} (its options: {takes})")
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        low, high = _OPTION_RANGES.get(key, (-math.inf, math.inf))
        if not number or not low <= float(value) <= high:
            raise OptionError(f"sampler option {key} must be a number in [{low}, {high}], got {value!r}")
        values[key] = float(value)
    return values


def noise_from_seed(seed: int) -> NoiseFn:
    """A reproducible :data:`NoiseFn` (numpy PCG64): what a pipeline passes to ``step``."""
    rng = np.random.default_rng(seed)

    def draw(shape: tuple[int, ...]) -> NDArray[np.float32]:
        return rng.standard_normal(shape, dtype=np.float32)

    return draw


def f32(array: object) -> NDArray[np.float32]:
    """``array`` as a float32 ndarray (no copy when it already is one)."""
    return np.asarray(array, dtype=np.float32)


def as_f32(array: object, what: str) -> NDArray[np.float32]:
    """A float32 array, or an InputError naming the argument."""
    try:
        result = np.asarray(array, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be a float array: {exc}") from None
    return result


class Scheduler(ABC):
    """Base of every scheduler. Subclasses set the class attributes and implement
    ``_build``, ``_scale`` and ``_step``; this class does configuration, step counting,
    img2img ``strength`` and argument checks.

    Class attributes (what the registry and the docs read):
      name, aliases: canonical name and the names A1111 / ComfyUI users type.
      label: the name A1111 writes in an image's ``Sampler:`` field ("Euler a", "DPM++ 2M");
        unset, ``sampler_label()`` falls back to the first alias, then to ``name``.
      schedules: the sigma schedules it supports (subset of ``SCHEDULES``).
      order: model evaluations per step (2 for Heun and DPM++ SDE), as diffusers' ``order``.
      needs_noise: whether ``step`` draws noise (ancestral and SDE samplers); an instance
        says it for its options with ``draws_noise`` (DDIM draws only when eta > 0).
      option_defaults: the sampler options it takes (keyword arguments of the constructor and of
        ``create_scheduler``) with their defaults: ``eta`` (DDIM), ``s_noise`` (A1111's "sigma
        noise" multiplier of the noise ancestral and SDE samplers add). An instance's
        ``options`` holds the values in force.
      prediction_types: the model predictions it integrates: ``epsilon`` and ``v_prediction``
        (discrete-time samplers) or ``flow`` (flow-matching velocity: SD3, Flux, Chroma).
      needs_uncond: whether ``step`` uses the unguided prediction (``uncond=``; CFG++ samplers).
      variant_of: for a sampler of another prediction type, the sampler whose name asks for it
        (``euler_flow`` is ``euler`` for flow models): ``scheduler_class(name, prediction_type)``
        and ``create_scheduler`` pick it, so a user's "Euler" works on every model.
      schedule_variant_of: for a sampler that runs the schedules another one lacks, that sampler
        (``ddim_sigmas`` is ComfyUI's ddim, on sigma schedules): ``create_scheduler("DDIM Karras")``
        picks it where ``ddim`` does not take the schedule.
      schedules_note: why the schedules it lacks are missing, appended to the refusal of one.
      flow_note: why it has no flow-model variant, appended to its refusal on a flow model.
      diffusers_class: the diffusers scheduler it is checked against.
      diffusers_defaults: that class's ``__init__`` defaults for config keys a config may omit.
      default_config: the config ``config=None`` means (SD 1.x's ``SD15_CONFIG``; ``{}`` for flow).
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    label: ClassVar[str] = ""
    schedules: ClassVar[tuple[str, ...]] = SCHEDULES
    order: ClassVar[int] = 1
    needs_noise: ClassVar[bool] = False
    option_defaults: ClassVar[dict[str, float]] = {}
    prediction_types: ClassVar[tuple[str, ...]] = ("epsilon", "v_prediction")
    needs_uncond: ClassVar[bool] = False
    variant_of: ClassVar[str] = ""
    schedule_variant_of: ClassVar[str] = ""
    schedules_note: ClassVar[str] = ""
    flow_note: ClassVar[str] = ""
    diffusers_class: ClassVar[str] = ""
    diffusers_defaults: ClassVar[dict[str, Any]] = {}
    default_config: ClassVar[Mapping[str, Any]] = SD15_CONFIG

    def __init__(
        self,
        schedule: str = "normal",
        config: Mapping[str, Any] | None = None,
        prediction_type: str | None = None,
        **options: float,
    ) -> None:
        self.options: dict[str, float] = _checked_options(self.name, self.option_defaults, options)
        if schedule not in self.schedules:
            note = f" ({self.schedules_note})" if self.schedules_note else ""
            raise OptionError(
                f"sampler {self.name!r} does not support schedule {schedule!r}; use one of "
                f"{', '.join(self.schedules)}{note}"
            )
        if config is not None and not isinstance(config, Mapping):
            raise OptionError(f"scheduler config must be a dict (scheduler_config.json), got {type(config).__name__}")
        data = dict(self.default_config if config is None else config)
        if prediction_type is not None:
            data["prediction_type"] = prediction_type
        if schedule == "sgm_uniform":
            data["timestep_spacing"] = "trailing"
        self.schedule = schedule
        self.config = SchedulerConfig.from_dict(data, self.diffusers_defaults)
        if self.config.prediction_type not in self.prediction_types:
            raise OptionError(
                f"sampler {self.name!r} does not run {self.config.prediction_type!r} models "
                f"(it takes {', '.join(self.prediction_types)})"
            )
        cfg = self.config
        self.betas = noise_schedule.training_betas(
            cfg.num_train_timesteps, cfg.beta_start, cfg.beta_end, cfg.beta_schedule, cfg.trained_betas
        )
        self.alphas_cumprod = noise_schedule.cumulative_alphas(self.betas)
        self.num_inference_steps: int | None = None
        self._timesteps: NDArray[Any] = np.zeros(0, dtype=np.float32)
        self._sigmas: NDArray[np.float32] = np.zeros(0, dtype=np.float32)
        self._begin = 0
        self._index = 0
        self._uncond: NDArray[np.float32] | None = None
        self._configure()

    def _configure(self) -> None:
        """A sampler's own checks and state from its config and options, once the base has set
        them (the end of ``__init__``); an override calls ``super()._configure()`` first."""

    # -- public API ---------------------------------------------------------------------

    def __repr__(self) -> str:
        steps = "unset" if self.num_inference_steps is None else f"{len(self.timesteps)} timesteps"
        return f"<{type(self).__name__} {self.name!r} schedule={self.schedule!r} {self.prediction_type} ({steps})>"

    @property
    def prediction_type(self) -> str:
        return self.config.prediction_type

    @property
    def timesteps(self) -> NDArray[Any]:
        """The model timesteps still to run (the img2img tail when strength < 1), in
        diffusers' dtype: float32 (euler, euler_a, heun), float64 (dpmpp_sde, whose midpoint
        timesteps are fractional) or int64 (dpmpp_2m, dpmpp_2m_sde, ddim, lcm). Cast them
        to whatever the model's timestep input wants."""
        return self._timesteps[self._begin :]

    @property
    def sigmas(self) -> NDArray[np.float32]:
        """k-diffusion sigmas aligned with ``timesteps`` plus the final one."""
        return self._sigmas[self._begin :]

    @property
    def init_noise_sigma(self) -> float:
        """Scale of the initial txt2img noise."""
        return 1.0

    @property
    def draws_noise(self) -> bool:
        """Whether ``step`` calls its ``noise`` callable (with these options)."""
        return self.needs_noise

    def set_timesteps(self, num_inference_steps: int, strength: float = 1.0) -> None:
        """Prepare ``num_inference_steps`` steps. ``strength < 1`` (img2img) keeps only the
        last ``int(steps * strength)`` steps, as diffusers' img2img ``get_timesteps`` does."""
        if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, (int, np.integer)):
            raise InputError(f"num_inference_steps must be an integer, got {num_inference_steps!r}")
        steps = int(num_inference_steps)
        if not 1 <= steps <= self.config.num_train_timesteps:
            raise InputError(f"num_inference_steps must be in 1..{self.config.num_train_timesteps}, got {steps}")
        if not 0.0 <= float(strength) <= 1.0:
            raise InputError(f"strength must be in [0, 1], got {strength}")
        self.num_inference_steps = steps
        self._build(steps, float(strength))
        self._index = self._begin = self._begin_for_strength(steps, float(strength))
        if self._begin >= len(self._timesteps):
            raise InputError(f"strength {strength} with {steps} steps leaves no step to run")

    def set_begin_index(self, index: int) -> None:
        """Start at ``index`` of the whole schedule (``set_timesteps`` with strength 1 first), as
        diffusers' ``set_begin_index``: an SDXL refiner's ``denoising_start`` takes over the
        schedule where the base stopped. ``timesteps`` then holds what is left from there."""
        if self.num_inference_steps is None:
            raise InputError("call set_timesteps() before set_begin_index()")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise InputError(f"begin index must be an integer, got {index!r}")
        if not 0 <= int(index) < len(self._timesteps):
            raise InputError(f"begin index {index} is outside the schedule's {len(self._timesteps)} timesteps")
        self._index = self._begin = int(index)

    def scale_model_input(self, sample: NDArray[np.float32], timestep: float | NDArray[Any]) -> NDArray[np.float32]:
        """The model's input for this step (k-diffusion samplers divide by sqrt(sigma^2 + 1))."""
        self._check_timestep(timestep)
        return self._scale(as_f32(sample, "sample"))

    def step(
        self,
        model_output: NDArray[np.float32],
        timestep: float | NDArray[Any],
        sample: NDArray[np.float32],
        noise: NoiseFn | None = None,
        uncond: NDArray[np.float32] | None = None,
    ) -> NDArray[np.float32]:
        """One solver step: the sample for the next timestep. ``uncond``: the unguided (negative
        prompt) prediction, which CFG++ samplers (``needs_uncond``) use; others ignore it."""
        self._check_timestep(timestep)
        out = as_f32(model_output, "model_output")
        x = as_f32(sample, "sample")
        if out.shape != x.shape:
            raise InputError(f"model_output shape {out.shape} differs from sample shape {x.shape}")
        self._uncond = None if uncond is None else as_f32(uncond, "uncond")
        if self._uncond is not None and self._uncond.shape != x.shape:
            raise InputError(f"uncond shape {self._uncond.shape} differs from sample shape {x.shape}")
        if self.draws_noise and noise is None:
            raise InputError(
                f"sampler {self.name!r} adds noise in step(): pass noise=callable(shape) "
                "(e.g. sdkit.schedulers.noise_from_seed(seed))"
            )
        result = self._step(out, x, noise)
        self._index += 1
        return result.astype(np.float32, copy=False)

    def add_noise(
        self, original: NDArray[np.float32], noise: NDArray[np.float32], timestep: float | NDArray[Any]
    ) -> NDArray[np.float32]:
        """Noise clean latents to ``timestep`` (the img2img starting point)."""
        x0, eps = as_f32(original, "original"), as_f32(noise, "noise")
        if x0.shape != eps.shape:
            raise InputError(f"noise shape {eps.shape} differs from original shape {x0.shape}")
        return self._add_noise(x0, eps, self._lookup(timestep)).astype(np.float32, copy=False)

    # -- for subclasses -----------------------------------------------------------------

    @abstractmethod
    def _build(self, steps: int, strength: float) -> None:
        """Fill ``self._timesteps`` and ``self._sigmas`` for ``steps`` steps."""

    def _begin_for_strength(self, steps: int, strength: float) -> int:
        init_timestep = min(int(steps * strength), steps)
        return max(steps - init_timestep, 0) * self.order

    def _scale(self, sample: NDArray[np.float32]) -> NDArray[np.float32]:
        return sample

    @abstractmethod
    def _step(
        self, model_output: NDArray[np.float32], sample: NDArray[np.float32], noise: NoiseFn | None
    ) -> NDArray[np.float32]:
        """Step number ``self._index`` (an index into ``self._timesteps``)."""

    @abstractmethod
    def _add_noise(self, original: NDArray[np.float32], noise: NDArray[np.float32], index: int) -> NDArray[np.float32]:
        """Noise ``original`` to the level of ``self._timesteps[index]``."""

    def _draw(self, noise: NoiseFn | None, shape: tuple[int, ...]) -> NDArray[np.float32]:
        assert noise is not None  # step() checked
        drawn = np.asarray(noise(shape), dtype=np.float32)
        if drawn.shape != shape:
            raise InputError(f"noise callable returned shape {drawn.shape}, expected {shape}")
        return drawn

    # -- bookkeeping --------------------------------------------------------------------

    def _check_timestep(self, timestep: float | NDArray[Any]) -> None:
        if self.num_inference_steps is None:
            raise InputError("call set_timesteps() before scale_model_input() or step()")
        if self._index >= len(self._timesteps):
            raise InputError(f"all {len(self.timesteps)} steps are done; call set_timesteps() to start again")
        expected = float(self._timesteps[self._index])
        if abs(float(np.asarray(timestep).reshape(-1)[0]) - expected) > 1e-3:
            raise InputError(
                f"timestep {float(np.asarray(timestep).reshape(-1)[0])} is not the next one ({expected}); "
                "loop over scheduler.timesteps in order"
            )

    def _lookup(self, timestep: float | NDArray[Any]) -> int:
        if self.num_inference_steps is None:
            raise InputError("call set_timesteps() before add_noise()")
        value = float(np.asarray(timestep).reshape(-1)[0])
        tail = np.asarray(self.timesteps, dtype=np.float64)
        hits = np.nonzero(np.abs(tail - value) <= 1e-3)[0]
        if hits.size == 0:
            raise InputError(f"timestep {value} is not one of this schedule's timesteps")
        return self._begin + int(hits[0])
