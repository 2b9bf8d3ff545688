"""DDIM (eta = 0) and LCM: samplers on the discrete training timesteps, as diffusers'
DDIMScheduler and LCMScheduler.

Both work in the variance-preserving parameterisation (``init_noise_sigma`` 1, identity
``scale_model_input``) and index ``alphas_cumprod`` by integer timestep. ``sigmas`` is
given for information: the k-diffusion sigma of each timestep, then 0.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.schedulers.base import NoiseFn, Scheduler, f32

F32 = NDArray[np.float32]
ONE = np.float32(1.0)


class DiscreteScheduler(Scheduler):
    """Shared by DDIM and LCM: integer timesteps indexing ``alphas_cumprod``."""

    schedules: ClassVar[tuple[str, ...]] = ("normal", "sgm_uniform")

    def _final_alpha(self) -> np.float32:
        return ONE if self.config.set_alpha_to_one else cast(np.float32, self.alphas_cumprod[0])

    def _alpha(self, timestep: int) -> np.float32:
        return self.alphas_cumprod[timestep] if timestep >= 0 else self._final_alpha()

    def _set_sigmas(self) -> None:
        alphas = self.alphas_cumprod[self._timesteps]
        sigmas = np.sqrt((ONE - alphas) / alphas)
        self._sigmas = np.concatenate([sigmas, [np.float32(0.0)]]).astype(np.float32)

    def _x0(self, model_output: F32, sample: F32, alpha_t: np.float32) -> F32:
        beta_t = ONE - alpha_t
        if self.prediction_type == "epsilon":
            x0 = (sample - np.sqrt(beta_t) * model_output) / np.sqrt(alpha_t)
        else:
            x0 = np.sqrt(alpha_t) * sample - np.sqrt(beta_t) * model_output
        if self.config.clip_sample:
            limit = np.float32(self.config.clip_sample_range)
            x0 = np.clip(x0, -limit, limit)
        return f32(x0)

    def _add_noise(self, original: F32, noise: F32, index: int) -> F32:
        alpha = self.alphas_cumprod[int(self._timesteps[index])]
        return f32(np.sqrt(alpha) * original + np.sqrt(ONE - alpha) * noise)


class DDIM(DiscreteScheduler):
    """DDIM. ``eta`` (option, default 0: deterministic, as A1111's and ComfyUI's default) scales
    the fresh noise each step adds, as diffusers' ``DDIMScheduler.step(eta=...)``: with
    ``var = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)`` and ``std = eta * sqrt(var)``,
    ``prev = sqrt(a_prev) * x0 + sqrt(1 - a_prev - std^2) * eps + std * z`` where ``z`` is one
    standard-normal draw of the ``noise`` callable per step (drawn only when eta > 0). eta 1 is
    DDPM-like ancestral sampling."""

    name = "ddim"
    label = "DDIM"
    aliases: ClassVar[tuple[str, ...]] = ("DDIM",)
    option_defaults: ClassVar[dict[str, float]] = {"eta": 0.0}
    diffusers_class = "DDIMScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.0001,
        "beta_end": 0.02,
        "beta_schedule": "linear",
        "clip_sample": True,
        "set_alpha_to_one": True,
        "steps_offset": 0,
        "timestep_spacing": "leading",
    }

    def _build(self, steps: int, strength: float) -> None:
        total, spacing = self.config.num_train_timesteps, self.config.timestep_spacing
        if spacing == "linspace":
            timesteps = np.linspace(0, total - 1, steps).round()[::-1].astype(np.int64)
        elif spacing == "leading":
            timesteps = (np.arange(0, steps) * (total // steps)).round()[::-1].astype(
                np.int64
            ) + self.config.steps_offset
        else:  # trailing
            timesteps = np.round(np.arange(total, 0, -total / steps)).astype(np.int64) - 1
        if timesteps.max() >= total or timesteps.min() < 0:
            raise InputError(
                f"{steps} DDIM steps with steps_offset {self.config.steps_offset} leave timesteps 0..{total - 1}"
            )
        self._timesteps = timesteps
        self._set_sigmas()

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        assert self.num_inference_steps is not None
        timestep = int(self._timesteps[self._index])
        alpha_t = self.alphas_cumprod[timestep]
        alpha_prev = self._alpha(timestep - self.config.num_train_timesteps // self.num_inference_steps)
        x0 = self._x0(model_output, sample, alpha_t)
        if self.prediction_type == "epsilon":
            eps = model_output
        else:
            eps = np.sqrt(alpha_t) * model_output + np.sqrt(ONE - alpha_t) * sample
        eta = np.float32(self.options["eta"])
        if eta == 0:
            return f32(np.sqrt(alpha_prev) * x0 + np.sqrt(ONE - alpha_prev) * eps)
        # diffusers' DDIMScheduler._get_variance and step, in its float32 operation order
        variance = ((ONE - alpha_prev) / (ONE - alpha_t)) * (ONE - alpha_t / alpha_prev)
        std = eta * np.sqrt(variance)
        prev = np.sqrt(alpha_prev) * x0 + np.sqrt(ONE - alpha_prev - std * std) * eps
        return f32(prev + std * self._draw(noise, model_output.shape))

    @property
    def draws_noise(self) -> bool:
        return self.options["eta"] > 0


class LCM(DiscreteScheduler):
    """Latent Consistency Model sampling: each step predicts the clean sample and re-noises
    it to the next timestep (fresh noise from ``noise``), the last one returns it.

    The timesteps come from LCM's own distillation schedule (``original_inference_steps``,
    default 50); diffusers' LCMScheduler has no other schedule, so only "normal" exists.
    img2img ``strength`` shortens that schedule as LCMScheduler.set_timesteps does.
    """

    name = "lcm"
    label = "LCM"
    aliases: ClassVar[tuple[str, ...]] = ("LCM",)
    schedules: ClassVar[tuple[str, ...]] = ("normal",)
    needs_noise = True
    diffusers_class = "LCMScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "original_inference_steps": 50,
        "clip_sample": False,
        "set_alpha_to_one": True,
        "steps_offset": 0,
        "timestep_spacing": "leading",
        "timestep_scaling": 10.0,
    }

    def _build(self, steps: int, strength: float) -> None:
        original = int(self.config.original_inference_steps)
        total = self.config.num_train_timesteps
        if not 1 <= original <= total:
            raise InputError(f"original_inference_steps must be in 1..{total}, got {original}")
        origin = np.asarray(list(range(1, int(original * strength) + 1)), dtype=np.int64) * (total // original) - 1
        if steps > original or len(origin) < steps:
            raise InputError(
                f"LCM can take at most {min(original, len(origin))} steps here "
                f"(original_inference_steps={original}, strength={strength}), got {steps}"
            )
        origin = origin[::-1].copy()
        indices = np.floor(np.linspace(0, len(origin), num=steps, endpoint=False)).astype(np.int64)
        self._timesteps = origin[indices]
        self._set_sigmas()

    def _begin_for_strength(self, steps: int, strength: float) -> int:
        return 0  # strength already shaped the schedule in _build

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        timestep = int(self._timesteps[i])
        prev_timestep = int(self._timesteps[i + 1]) if i + 1 < len(self._timesteps) else timestep
        alpha_t, alpha_prev = self.alphas_cumprod[timestep], self._alpha(prev_timestep)
        # Consistency-model boundary scalings (sigma_data = 0.5), in float32 like diffusers.
        scaled = np.float32(timestep * self.config.timestep_scaling)
        c_skip = np.float32(0.25) / (scaled * scaled + np.float32(0.25))
        c_out = scaled / np.sqrt(scaled * scaled + np.float32(0.25))
        denoised = c_out * self._x0(model_output, sample, alpha_t) + c_skip * sample
        if i == len(self._timesteps) - 1:
            return f32(denoised)
        drawn = self._draw(noise, model_output.shape)
        return f32(np.sqrt(alpha_prev) * denoised + np.sqrt(ONE - alpha_prev) * drawn)
