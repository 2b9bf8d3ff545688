"""Euler, Euler ancestral and Heun: the k-diffusion samplers in sigma space.

Each matches its diffusers class (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
HeunDiscreteScheduler) operation for operation in float32, so results agree to rounding.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers import noise_schedule, sigma_schedules, table_schedules
from sdkit.schedulers.base import NoiseFn, Scheduler, f32

F32 = NDArray[np.float32]


class SigmaScheduler(Scheduler):
    """Shared by samplers that work on k-diffusion sigmas (x = x0 + sigma * eps)."""

    # Whether config sigma_min / sigma_max bound Karras and exponential schedules (only
    # EulerDiscreteScheduler reads them; the other diffusers classes have no such setting).
    config_sigma_range: ClassVar[bool] = False
    # The precision diffusers computes this class's timestep spacing in.
    spacing_dtype: ClassVar[type[np.floating[Any]]] = np.float32

    def _sigma_schedule(self, steps: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(timesteps, sigmas) without the final zero, both float64, for the chosen schedule."""
        cfg = self.config
        timesteps = noise_schedule.spaced_timesteps(
            cfg.timestep_spacing, steps, cfg.num_train_timesteps, cfg.steps_offset, self.spacing_dtype
        )
        train_sigmas = noise_schedule.training_sigmas(self.alphas_cumprod)
        if self.schedule in table_schedules.TABLE_SCHEDULES:  # ComfyUI's simple, ddim_uniform, beta
            return table_schedules.table_schedule(self.schedule, steps, train_sigmas)
        if self.schedule in sigma_schedules.COMPUTED_SCHEDULES:  # AYS, KL optimal, linear-quadratic
            ends = float(train_sigmas[0]), float(train_sigmas[-1])
            sigmas = sigma_schedules.computed_sigmas(self.schedule, steps, *ends)
            return noise_schedule.sigma_to_t(sigmas, np.log(train_sigmas)), sigmas
        sigmas = noise_schedule.interpolate_sigmas(timesteps, train_sigmas)
        if self.schedule in ("karras", "exponential"):
            sigma_min, sigma_max = float(sigmas[-1]), float(sigmas[0])
            if self.config_sigma_range:
                sigma_min = cfg.sigma_min if cfg.sigma_min is not None else sigma_min
                sigma_max = cfg.sigma_max if cfg.sigma_max is not None else sigma_max
            if self.schedule == "karras":
                sigmas = noise_schedule.karras_sigmas(sigma_min, sigma_max, steps)
            else:
                sigmas = noise_schedule.exponential_sigmas(sigma_min, sigma_max, steps)
            timesteps = noise_schedule.sigma_to_t(sigmas, np.log(train_sigmas))
        return timesteps, sigmas

    @property
    def init_noise_sigma(self) -> float:
        max_sigma = np.float32(self._sigmas.max()) if self._sigmas.size else np.float32(1.0)
        if self.config.timestep_spacing in ("linspace", "trailing"):
            return float(max_sigma)
        return float(np.sqrt(max_sigma * max_sigma + np.float32(1.0)))

    def _scale(self, sample: F32) -> F32:
        sigma = self._sigmas[self._index]
        return f32(sample / np.sqrt(sigma * sigma + np.float32(1.0)))

    def _add_noise(self, original: F32, noise: F32, index: int) -> F32:
        return f32(original + noise * self._sigmas[index])

    def _denoised(self, model_output: F32, sample: F32, sigma: np.float32) -> F32:
        """The model's estimate of the clean sample at noise level ``sigma``."""
        if self.prediction_type == "epsilon":
            return f32(sample - sigma * model_output)
        # v-prediction, in diffusers' operation order.
        variance = sigma * sigma + np.float32(1.0)
        return f32(model_output * (-sigma / np.sqrt(variance)) + sample / variance)


class Euler(SigmaScheduler):
    name = "euler"
    config_sigma_range = True
    label = "Euler"
    aliases: ClassVar[tuple[str, ...]] = ("Euler", "k_euler", "euler_discrete")
    diffusers_class = "EulerDiscreteScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.0001,
        "beta_end": 0.02,
        "beta_schedule": "linear",
        "timestep_spacing": "linspace",
        "steps_offset": 0,
    }

    def _build(self, steps: int, strength: float) -> None:
        timesteps, sigmas = self._sigma_schedule(steps)
        self._sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        self._timesteps = timesteps.astype(np.float32)

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        sigma = self._sigmas[self._index]
        denoised = self._denoised(model_output, sample, sigma)
        derivative = (sample - denoised) / sigma
        dt = self._sigmas[self._index + 1] - sigma
        return f32(sample + derivative * dt)


class EulerAncestral(Euler):
    """Euler ancestral. diffusers' EulerAncestralDiscreteScheduler has no Karras or exponential
    option; here those schedules are EulerDiscreteScheduler's (checked that way). Option
    ``s_noise`` (A1111's "sigma noise", default 1) multiplies the noise each step adds."""

    name = "euler_a"
    label = "Euler a"
    aliases: ClassVar[tuple[str, ...]] = (
        "Euler a",
        "euler_ancestral",
        "k_euler_a",
        "k_euler_ancestral",
        "euler_ancestral_discrete",
    )
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = {"s_noise": 1.0}
    diffusers_class = "EulerAncestralDiscreteScheduler"

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        sigma = self._sigmas[self._index]
        denoised = self._denoised(model_output, sample, sigma)
        sigma_to = self._sigmas[self._index + 1]
        sigma_from2, sigma_to2 = sigma * sigma, sigma_to * sigma_to
        sigma_up = np.sqrt(sigma_to2 * (sigma_from2 - sigma_to2) / sigma_from2)
        sigma_down = np.sqrt(sigma_to2 - sigma_up * sigma_up)
        derivative = (sample - denoised) / sigma
        dt = sigma_down - sigma
        prev = sample + derivative * dt
        # A1111's s_noise scales the fresh noise (k-diffusion: noise * s_noise * sigma_up).
        return f32(prev + self._draw(noise, sample.shape) * np.float32(self.options["s_noise"]) * sigma_up)


class Heun(SigmaScheduler):
    """Heun's second-order method: each step but the last evaluates the model twice, so
    ``timesteps`` repeats every timestep after the first (as diffusers)."""

    name = "heun"
    label = "Heun"
    aliases: ClassVar[tuple[str, ...]] = ("Heun", "k_heun", "heun_discrete")
    order = 2
    diffusers_class = "HeunDiscreteScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "linear",
        "timestep_spacing": "linspace",
        "steps_offset": 0,
        "clip_sample": False,
    }

    def _build(self, steps: int, strength: float) -> None:
        timesteps, sigmas = self._sigma_schedule(steps)
        sig = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        self._sigmas = np.concatenate([sig[:1], np.repeat(sig[1:-1], 2), sig[-1:]])
        self._timesteps = np.concatenate([timesteps[:1], np.repeat(timesteps[1:], 2)]).astype(np.float32)
        self._first: tuple[F32, F32, np.float32] | None = None  # (sample, derivative, dt) of the Euler half

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        first_half = self._first is None
        # The second half re-evaluates at the first half's target sigma.
        sigma, sigma_next = self._sigmas[i - 1 + first_half], self._sigmas[i + first_half]
        denoised = self._denoised(model_output, sample, sigma if first_half else sigma_next)
        if self.config.clip_sample:
            limit = np.float32(self.config.clip_sample_range)
            denoised = np.clip(denoised, -limit, limit)
        if self._first is None:
            derivative = (sample - denoised) / sigma
            dt = sigma_next - sigma
            self._first = (sample.copy(), derivative, dt)  # the caller may reuse its array
        else:
            start, first_derivative, dt = self._first
            derivative = (first_derivative + (sample - denoised) / sigma_next) / np.float32(2)
            sample = start
            self._first = None
        return f32(sample + derivative * dt)
