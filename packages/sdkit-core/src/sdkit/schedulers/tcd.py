"""TCD (Trajectory Consistency Distillation, Zheng et al. 2024), as diffusers' TCDScheduler.

For TCD-distilled models (TCD LoRAs). The timesteps are LCM's (``original_inference_steps``,
img2img ``strength`` shortens that schedule); each step at timestep ``t`` with next timestep
``t'`` (0 after the last) predicts the clean sample and noise, moves them to the intermediate
timestep ``s = floor((1 - eta) * t')`` (float32, as torch computes it) and, except on the last
step, re-noises from ``s`` to ``t'`` with a fresh draw of the ``noise`` callable:
``prev = sqrt(a_t' / a_s) * x_s + sqrt(1 - a_t' / a_s) * z``. ``eta`` (option, ComfyUI's and
diffusers' default 0.3; A1111's "gamma") 0 is deterministic (the move to ``s = t'`` only).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers.base import NoiseFn, f32
from sdkit.schedulers.ddim import LCM

F32 = NDArray[np.float32]
ONE = np.float32(1.0)


class TCD(LCM):
    name = "tcd"
    label = "TCD"
    aliases: ClassVar[tuple[str, ...]] = ("TCD",)
    # ComfyUI's core (comfy/k_diffusion/sampling.py, comfy_extras) has no TCD sampler: its TCD is the
    # ComfyUI-TCD custom node's, with that node's own scheduler. There is no UI reference for TCD on
    # sigma schedules to follow, so only diffusers' (LCM's timesteps) is offered.
    schedules_note = (
        "TCD runs LCM's timesteps, as diffusers' TCDScheduler; ComfyUI's core has no TCD sampler to follow on "
        "sigma schedules"
    )
    flow_note = (
        "ComfyUI's core has no TCD sampler (its TCD is the ComfyUI-TCD custom node's); TCD here is diffusers' "
        "TCDScheduler on an epsilon / v model's training timesteps"
    )
    option_defaults: ClassVar[dict[str, float]] = {"eta": 0.3}
    diffusers_class = "TCDScheduler"

    @property
    def draws_noise(self) -> bool:
        return self.options["eta"] > 0

    def _estimates(self, model_output: F32, sample: F32, alpha_t: np.float32) -> tuple[F32, F32]:
        """(clean sample, noise) predicted at a timestep of cumulative alpha ``alpha_t``."""
        beta_t = ONE - alpha_t
        if self.prediction_type == "epsilon":
            return f32((sample - np.sqrt(beta_t) * model_output) / np.sqrt(alpha_t)), model_output
        clean = f32(np.sqrt(alpha_t) * sample - np.sqrt(beta_t) * model_output)
        return clean, f32(np.sqrt(alpha_t) * model_output + np.sqrt(beta_t) * sample)

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        eta = self.options["eta"]
        last = i == len(self._timesteps) - 1
        timestep = int(self._timesteps[i])
        prev_timestep = 0 if last else int(self._timesteps[i + 1])
        between = int(np.floor(np.float32(1 - eta) * np.float32(prev_timestep)))
        alpha_t, alpha_prev = self.alphas_cumprod[timestep], self.alphas_cumprod[prev_timestep]
        alpha_s = self.alphas_cumprod[between]
        clean, eps = self._estimates(model_output, sample, alpha_t)
        noised = f32(np.sqrt(alpha_s) * clean + np.sqrt(ONE - alpha_s) * eps)
        if eta == 0 or last:
            return noised
        drawn = self._draw(noise, model_output.shape)
        return f32(np.sqrt(alpha_prev / alpha_s) * noised + np.sqrt(ONE - alpha_prev / alpha_s) * drawn)
