"""Euler for flow-matching models (SD3/3.5, Flux.1, Chroma): diffusers' FlowMatchEulerDiscreteScheduler.

A flow-matching model predicts a velocity ``v`` along the straight path between data and noise,
``x_sigma = (1 - sigma) * x0 + sigma * noise`` with ``sigma`` from 1 (pure noise) down to 0, and
Euler integrates it: ``x_next = x + (sigma_next - sigma) * v``. So, unlike the k-diffusion samplers:

- ``prediction_type`` is ``"flow"`` (a pipeline passes it; a config whose ``_class_name`` is a
  diffusers ``FlowMatch*`` scheduler implies it) and ``create_scheduler("Euler", ...)`` then gives
  this class: :func:`sdkit.schedulers.scheduler_class` picks the flow variant of a sampler;
- ``scale_model_input`` is the identity and ``init_noise_sigma`` is 1: the initial latents are the
  noise itself;
- the model's timestep is ``sigma * num_train_timesteps`` (float32; Flux's transformer takes
  ``timestep / 1000``, the pipeline divides);
- ``add_noise(x0, noise, t)`` is the flow interpolation above (diffusers' ``scale_noise``), the
  img2img starting point; img2img keeps the steps diffusers' SD3/Flux img2img pipelines keep
  (``t_start = int(steps - steps * strength)``, no rounding of ``steps * strength`` first).

Shift (the config): sigmas ``t`` in (0, 1] are shifted towards noise before use, by a fixed
``shift`` (SD3: 3.0; ``s * t / (1 + (s - 1) * t)``) or, with ``use_dynamic_shifting`` (Flux.1 dev,
Chroma), by the resolution-dependent ``mu``: ``exp(mu) / (exp(mu) + (1 / t - 1))``
(``time_shift_type="linear"``: ``mu / (mu + (1 / t - 1))``). ``mu`` is linear in the image
sequence length (latent cells / 4 for Flux's 2x2 patches): :meth:`FlowMatchEuler.mu_for`, which is
diffusers' ``calculate_shift`` with the config's base/max shift and base/max image sequence length.
``set_timesteps(steps, mu=...)`` takes it; ``sigmas=`` takes the unshifted sigmas a pipeline
chooses (the Flux and Chroma pipelines pass ``linspace(1, 1/steps, steps)``, :func:`linear_sigmas`).
``shift_terminal`` stretches the shifted schedule to end there, as diffusers does.

Schedules (``schedule=``), all shifted as above:

===========  ========================================================================================
normal       diffusers' default (the SD3 pipeline's): ``linspace(sigma_max, sigma_min, steps)`` of the
             scheduler's 1000-entry table (whose ``sigma_min`` is already shifted for a fixed shift,
             so it is shifted twice, as in diffusers and ComfyUI's "normal"); or ``sigmas=``
karras,      diffusers' ``use_karras_sigmas`` / ``use_exponential_sigmas``: rho-7 / log-even spacing
exponential  between the ends of the shifted normal schedule (or of the shifted ``sigmas=``)
simple,      ComfyUI's schedulers on its flow sigma table ``shift((i + 1) / N)``, ``i = 0 .. N-1``:
ddim_uniform the picks of :mod:`sdkit.schedulers.table_schedules`, the same code the discrete
beta        samplers use. N is ComfyUI's table size: 10000 for a dynamically shifted model
             (``ModelSamplingFlux``), else ``num_train_timesteps`` (``ModelSamplingDiscreteFlow``)
sgm_uniform  ComfyUI's: ``linspace(1, sigma_min, steps + 1)[:-1]`` with that table's ``sigma_min``
kl_optimal,  ComfyUI's formulas (:mod:`sdkit.schedulers.sigma_schedules`) between the ends of that
linear_     shifted table, ``sigma_min = shift(1 / N)`` and ``sigma_max = shift(1) = 1``, not shifted
quadratic    again (no diffusers equivalent; checked against the formulas)
===========  ========================================================================================

The non-default schedules are checked against diffusers by handing it those unshifted sigmas
(``set_timesteps(sigmas=...)``): the golden cases of ``fixtures/schedulers/make_golden.py``.
Numerics follow diffusers' dtypes path by path (float64 for the default schedule, float32 for
given sigmas), so results agree to float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError, OptionError
from sdkit.schedulers import noise_schedule, sigma_schedules, table_schedules
from sdkit.schedulers.base import NoiseFn, Scheduler, f32

F32 = NDArray[np.float32]
Floats = NDArray[np.floating[Any]]

# ComfyUI's ModelSamplingFlux builds its sigma table with 10000 entries (ModelSamplingDiscreteFlow,
# SD3's, with num_train_timesteps).
DYNAMIC_TABLE_SIZE = 10000
TIME_SHIFT_TYPES = ("exponential", "linear")

# diffusers settings this class refuses (they change results in ways not implemented here).
_REFUSED = {"invert_sigmas": "Mochi's inverted sigmas", "stochastic_sampling": "stochastic sampling"}


def linear_sigmas(steps: int) -> NDArray[np.float64]:
    """``linspace(1, 1/steps, steps)``: the unshifted sigmas diffusers' Flux and Chroma pipelines pass."""
    return np.linspace(1.0, 1.0 / steps, steps)


@dataclass(frozen=True)
class FlowShift:
    """The flow-matching keys of a FlowMatchEulerDiscreteScheduler ``scheduler_config.json``."""

    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    time_shift_type: str = "exponential"
    shift_terminal: float | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FlowShift:
        for key, what in _REFUSED.items():
            if extra.get(key):
                raise OptionError(f"scheduler config {key}=True ({what}) is not supported by sdkit's flow Euler")
        values: dict[str, Any] = {}
        for key in ("shift", "base_shift", "max_shift", "shift_terminal"):
            if extra.get(key) is not None:
                values[key] = _number(key, extra[key])
        for key in ("base_image_seq_len", "max_image_seq_len"):
            if key in extra:
                values[key] = int(_number(key, extra[key]))
        if "use_dynamic_shifting" in extra:
            values["use_dynamic_shifting"] = bool(extra["use_dynamic_shifting"])
        if "time_shift_type" in extra:
            values["time_shift_type"] = extra["time_shift_type"]
        shift = cls(**values)
        if shift.time_shift_type not in TIME_SHIFT_TYPES:
            raise OptionError(f"time_shift_type {shift.time_shift_type!r}: use one of {', '.join(TIME_SHIFT_TYPES)}")
        if not shift.shift > 0 or shift.base_image_seq_len == shift.max_image_seq_len:
            raise OptionError("scheduler config: shift must be > 0 and base/max_image_seq_len must differ")
        if shift.shift_terminal is not None and not 0 <= shift.shift_terminal < 1:
            raise OptionError(f"shift_terminal must be in [0, 1), got {shift.shift_terminal}")
        return shift

    def mu_for(self, image_seq_len: int) -> float:
        """diffusers' ``calculate_shift``: mu linear in the image sequence length."""
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return image_seq_len * slope + (self.base_shift - slope * self.base_image_seq_len)

    def apply(self, t: Floats, mu: float | None) -> Floats:
        """Shift unshifted sigmas ``t``, in their dtype (as diffusers' numpy code)."""
        if not self.use_dynamic_shifting:
            return self.shift * t / (1 + (self.shift - 1) * t)
        assert mu is not None  # set_timesteps checked
        if self.time_shift_type == "exponential":
            return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)
        return mu / (mu + (1 / t - 1) ** 1.0)

    def stretch(self, sigmas: Floats) -> Floats:
        """diffusers' ``stretch_shift_to_terminal``: the schedule ends at ``shift_terminal``."""
        if not self.shift_terminal:
            return sigmas
        one_minus = 1 - sigmas
        scale = one_minus[-1] / (1 - self.shift_terminal)
        return 1 - (one_minus / scale)  # type: ignore[no-any-return]


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise OptionError(f"scheduler config {key}={value!r} must be a number")
    if not np.isfinite(value):
        raise OptionError(f"scheduler config {key}={value!r} must be finite")
    return float(value)


class FlowMatchEuler(Scheduler):
    """Euler on a flow-matching model's velocity (diffusers' FlowMatchEulerDiscreteScheduler)."""

    name = "euler_flow"
    label = "Euler"  # what A1111/Forge write for Flux and SD3 images
    aliases: ClassVar[tuple[str, ...]] = (
        "flow_match_euler",
        "flow_match_euler_discrete",
        "FlowMatchEulerDiscrete",
        "euler_flow_match",
    )
    variant_of = "euler"
    schedules: ClassVar[tuple[str, ...]] = (
        "normal",
        "karras",
        "exponential",
        "sgm_uniform",
        "simple",
        "ddim_uniform",
        "beta",
        "kl_optimal",
        "linear_quadratic",
    )
    prediction_types: ClassVar[tuple[str, ...]] = ("flow",)
    diffusers_class = "FlowMatchEulerDiscreteScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {"num_train_timesteps": 1000, "prediction_type": "flow"}
    # SD 1.x's config (what config=None means elsewhere) has nothing for a flow model.
    default_config: ClassVar[Mapping[str, Any]] = {}

    def _configure(self) -> None:
        super()._configure()
        self.flow = FlowShift.from_extra(self.config.extra)
        self._given_sigmas: Floats | None = None
        self._mu: float | None = None
        self._table_t = self._init_table()

    @property
    def uses_dynamic_shifting(self) -> bool:
        """Whether ``set_timesteps`` needs ``mu`` (the config's ``use_dynamic_shifting``)."""
        return self.flow.use_dynamic_shifting

    def mu_for(self, image_seq_len: int) -> float:
        """The resolution-dependent ``mu`` for ``image_seq_len`` transformer image tokens (Flux:
        ``(latent_h // 2) * (latent_w // 2)``; SD3 with dynamic shifting: latent cells / patch^2)."""
        return self.flow.mu_for(int(image_seq_len))

    def set_timesteps(
        self,
        num_inference_steps: int,
        strength: float = 1.0,
        *,
        sigmas: Sequence[float] | NDArray[Any] | None = None,
        mu: float | None = None,
    ) -> None:
        """As the base class, plus diffusers' ``sigmas=`` (unshifted, one per step; schedules
        normal, karras and exponential, which respace them) and ``mu=`` (required with
        ``use_dynamic_shifting``, see :meth:`mu_for`)."""
        if self.flow.use_dynamic_shifting and mu is None:
            raise InputError(
                "this flow model's scheduler shifts by resolution (use_dynamic_shifting): "
                "pass mu=scheduler.mu_for(image_seq_len) to set_timesteps()"
            )
        if mu is not None and not math.isfinite(float(mu)):
            raise InputError(f"mu must be a finite number, got {mu!r}")
        given = None
        if sigmas is not None:
            if self.schedule not in ("normal", "karras", "exponential"):
                raise OptionError(
                    f"sigmas= replaces the schedule's spacing; it cannot be combined with {self.schedule!r}"
                )
            given = np.asarray(sigmas, dtype=np.float64).reshape(-1)
            if given.size != num_inference_steps or not np.all((given > 0) & (given <= 1)):
                raise InputError(f"sigmas must be {num_inference_steps} values in (0, 1], got {given.tolist()}")
        self._given_sigmas, self._mu = given, None if mu is None else float(mu)
        super().set_timesteps(num_inference_steps, strength)

    # -- schedule ----------------------------------------------------------------------------

    def _init_table(self) -> F32:
        """diffusers' ``__init__`` table ``t / N`` (float32, shifted there unless dynamic)."""
        total = self.config.num_train_timesteps
        t = np.linspace(1, total, total, dtype=np.float32)[::-1] / np.float32(total)
        return f32(t) if self.flow.use_dynamic_shifting else f32(self.flow.apply(f32(t), None))

    def _comfy_table_t(self) -> NDArray[np.float64]:
        """ComfyUI's flow sigma table before shifting: ``(i + 1) / N``."""
        size = DYNAMIC_TABLE_SIZE if self.flow.use_dynamic_shifting else self.config.num_train_timesteps
        return np.arange(1, size + 1, dtype=np.float64) / size

    def _unshifted(self, steps: int) -> Floats:
        """The schedule before shifting: float64 for diffusers' default path, else float32
        (diffusers casts given sigmas to float32 before shifting them)."""
        if self._given_sigmas is not None:
            return self._given_sigmas.astype(np.float32)
        if self.schedule in table_schedules.TABLE_SCHEDULES:
            _, picked = table_schedules.table_schedule(self.schedule, steps, f32(self._comfy_table_t()))
            return picked.astype(np.float32)
        if self.schedule == "sgm_uniform":
            sigma_min = float(self.flow.apply(self._comfy_table_t()[:1], self._mu)[0])
            return np.linspace(1.0, sigma_min, steps + 1)[:-1].astype(np.float32)
        total = self.config.num_train_timesteps
        top, bottom = float(self._table_t[0]) * total, float(self._table_t[-1]) * total
        return np.linspace(top, bottom, steps) / total

    def _build(self, steps: int, strength: float) -> None:
        shifted: Floats
        if self.schedule in ("kl_optimal", "linear_quadratic"):
            # ComfyUI computes these from its (shifted) flow table's ends, and shifts nothing after.
            table = self.flow.apply(self._comfy_table_t(), self._mu)
            shifted = sigma_schedules.computed_sigmas(self.schedule, steps, float(table[0]), float(table[-1]))
        else:
            shifted = self.flow.stretch(self.flow.apply(self._unshifted(steps), self._mu))
        if self.schedule == "karras":
            shifted = noise_schedule.karras_sigmas(float(shifted[-1]), float(shifted[0]), len(shifted))
        elif self.schedule == "exponential":
            shifted = noise_schedule.exponential_sigmas(float(shifted[-1]), float(shifted[0]), len(shifted))
        sigmas = shifted.astype(np.float32)
        self._timesteps = f32(sigmas * np.float32(self.config.num_train_timesteps))
        self._sigmas = np.concatenate([sigmas, np.zeros(1, np.float32)])

    def _begin_for_strength(self, steps: int, strength: float) -> int:
        # diffusers' SD3/Flux img2img get_timesteps: no int() around steps * strength.
        return int(max(steps - min(steps * strength, steps), 0))

    # -- steps -------------------------------------------------------------------------------

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        dt = self._sigmas[self._index + 1] - self._sigmas[self._index]
        return f32(sample + dt * model_output)

    def _add_noise(self, original: F32, noise: F32, index: int) -> F32:
        sigma = self._sigmas[index]
        return f32(sigma * noise + (np.float32(1.0) - sigma) * original)
