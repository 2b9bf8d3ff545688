"""DPM-Solver++ SDE (k-diffusion's ``sample_dpmpp_sde`` with eta=1, r=1/2), as diffusers'
DPMSolverSDEScheduler.

Every step but the last takes two model evaluations: one at sigma and one at the midpoint
(in log sigma) sigma_mid, so ``timesteps`` interleaves the step timesteps with midpoint ones.
Each half adds noise. diffusers (like k-diffusion) draws it from a torchsde Brownian tree
W over sigma: the first half adds the normalised increment of W over [sigma_mid, sigma],
the second the one over [sigma_next, sigma], which contains the first, so the two are
correlated. Here the same construction is built from two standard-normal draws of the
``noise`` callable per step (z1, z2):

    first half:  z1
    second half: (sqrt(sigma - sigma_mid) * z1 + sqrt(sigma_mid - sigma_next) * z2) / sqrt(sigma - sigma_next)

which has exactly the Brownian tree's joint distribution (not its values: torchsde's
tree is seeded differently). The golden test injects these same noises into diffusers'
DPMSolverSDEScheduler, so its update formulas are checked as they are.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers import noise_schedule
from sdkit.schedulers.base import NoiseFn, f32
from sdkit.schedulers.k_samplers import SigmaScheduler

F32 = NDArray[np.float32]


def _t(sigma: np.float32) -> np.float32:
    """Time in -log sigma; +inf at sigma 0."""
    return cast(np.float32, -noise_schedule.log32(sigma))


def _sigma(t: np.float32) -> np.float32:
    return noise_schedule.exp32(-t)


class DPMPPSDE(SigmaScheduler):
    name = "dpmpp_sde"
    label = "DPM++ SDE"
    aliases: ClassVar[tuple[str, ...]] = (
        "DPM++ SDE",
        "k_dpmpp_sde",
        "dpm_solver_sde",
        "dpmpp_sde_gpu",
    )  # see DPMPP2MSDE
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = {"s_noise": 1.0}  # A1111's "sigma noise": scales both noises
    spacing_dtype = np.float64
    diffusers_class = "DPMSolverSDEScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "linear",
        "timestep_spacing": "linspace",
        "steps_offset": 0,
    }

    def _build(self, steps: int, strength: float) -> None:
        timesteps, sigmas = self._sigma_schedule(steps)
        # Midpoint timesteps, all in float64 as diffusers computes them.
        log_train_sigmas = np.log(noise_schedule.training_sigmas(self.alphas_cumprod))
        t = -np.log(sigmas)
        midpoints = noise_schedule.sigma_to_t(np.exp(-(t[:-1] + np.diff(t) * 0.5)), log_train_sigmas)
        sig = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        self._sigmas = np.concatenate([sig[:1], np.repeat(sig[1:-1], 2), sig[-1:]])
        all_timesteps = np.concatenate([timesteps[:1], np.repeat(timesteps[1:], 2)])
        all_timesteps[1::2] = midpoints
        self._timesteps = all_timesteps
        self._start: F32 | None = None  # the sample at the start of a two-stage step
        self._mid_sigma = np.float32(0.0)
        self._first_draw: F32 | None = None  # z1 of the current step

    def _scale(self, sample: F32) -> F32:
        sigma = self._sigmas[self._index] if self._start is None else self._mid_sigma
        return f32(sample / np.sqrt(sigma * sigma + np.float32(1.0)))

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        first_half = self._start is None
        sigma, sigma_next = self._sigmas[i - 1 + first_half], self._sigmas[i + first_half]
        t, t_next = _t(sigma), _t(sigma_next)
        t_mid = t + (t_next - t) * np.float32(0.5)
        denoised = self._denoised(model_output, sample, sigma if first_half else _sigma(t_mid))
        if sigma_next == 0:  # the last step: plain Euler to sigma 0
            return f32(sample + (sample - denoised) / sigma * (sigma_next - sigma))
        if first_half:
            t_next = t_mid
        else:
            assert self._start is not None
            sample = self._start
        sigma_from, sigma_to = _sigma(t), _sigma(t_next)
        sigma_up = np.minimum(
            sigma_to,
            np.sqrt(sigma_to * sigma_to * (sigma_from * sigma_from - sigma_to * sigma_to) / (sigma_from * sigma_from)),
        )
        sigma_down = np.sqrt(sigma_to * sigma_to - sigma_up * sigma_up)
        t_down = _t(sigma_down)
        prev = _sigma(t_down) / _sigma(t) * sample - noise_schedule.expm1_32(t - t_down) * denoised
        prev = (
            prev
            + self._brownian_noise(noise, sample.shape, first_half, sigma_from, sigma_to)
            * np.float32(self.options["s_noise"])
            * sigma_up
        )
        if first_half:
            self._start, self._mid_sigma = sample.copy(), _sigma(t_next)  # the caller may reuse its array
        else:
            self._start = None
        return f32(prev)

    def _brownian_noise(
        self, noise: NoiseFn | None, shape: tuple[int, ...], first_half: bool, sigma: np.float32, sigma_to: np.float32
    ) -> F32:
        """Normalised Brownian increment over [sigma_to, sigma] (see the module docstring)."""
        drawn = self._draw(noise, shape)
        if first_half:
            self._first_draw = drawn
            return drawn
        assert self._first_draw is not None
        first, mid = self._first_draw.astype(np.float64), float(self._mid_sigma)
        whole = math.sqrt(float(sigma) - mid) * first + math.sqrt(mid - float(sigma_to)) * drawn.astype(np.float64)
        return f32(whole / math.sqrt(float(sigma) - float(sigma_to)))
