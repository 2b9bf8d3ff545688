"""DPM-Solver++(2M) and its SDE variant, as diffusers' DPMSolverMultistepScheduler
(``algorithm_type="dpmsolver++"`` / ``"sde-dpmsolver++"``, ``solver_order=2``,
``solver_type="midpoint"``, ``lower_order_final=True``, ``final_sigmas_type="zero"``).

It works in the variance-preserving parameterisation x_t = alpha_t * x0 + sigma_t * eps,
so ``init_noise_sigma`` is 1 and ``scale_model_input`` is the identity; the k-diffusion
``sigmas`` are kept for the schedule (sigma = sigma_t / alpha_t).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import OptionError
from sdkit.schedulers import noise_schedule, sigma_schedules, table_schedules
from sdkit.schedulers.base import NoiseFn, Scheduler, f32

F32 = NDArray[np.float32]
ONE = np.float32(1.0)


def _alpha_sigma(sigma: np.float32) -> tuple[np.float32, np.float32]:
    """(alpha_t, sigma_t) of a k-diffusion sigma, in float32 like diffusers."""
    alpha_t = ONE / np.sqrt(sigma * sigma + ONE)
    return alpha_t, sigma * alpha_t


def _lambda(alpha_t: np.float32, sigma_t: np.float32) -> np.float32:
    """Half log-SNR; +inf at sigma 0 (the final step), as in diffusers."""
    return cast(np.float32, noise_schedule.log32(alpha_t) - noise_schedule.log32(sigma_t))


class DPMSolverMultistep(Scheduler):
    """Shared by DPM++ 2M and DPM++ 2M SDE; ``stochastic`` picks the SDE update."""

    stochastic: ClassVar[bool] = False
    # Config settings that would pick another algorithm than the name's, with the value it uses.
    required_settings: ClassVar[tuple[tuple[str, object], ...]] = (
        ("solver_type", "midpoint"),
        ("lower_order_final", True),
        ("euler_at_final", False),
    )
    # Whether Karras timesteps are rounded for the cosine beta schedule too (UniPC, DEIS do).
    round_cosine_karras: ClassVar[bool] = False
    diffusers_class = "DPMSolverMultistepScheduler"
    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.0001,
        "beta_end": 0.02,
        "beta_schedule": "linear",
        "timestep_spacing": "linspace",
        "steps_offset": 0,
    }

    def _configure(self) -> None:
        super()._configure()
        # The sampler name picks the algorithm; settings that would change it are refused.
        for key, wanted in self.required_settings:
            value = self.config.extra.get(key, wanted)
            if value != wanted:
                raise OptionError(
                    f"scheduler config {key}={value!r} is not supported by {self.name!r} (uses {wanted!r})"
                )

    def _build(self, steps: int, strength: float) -> None:
        cfg = self.config
        total = cfg.num_train_timesteps
        # lambda_min_clipped is -inf by default, so the schedule may reach the last timestep.
        if cfg.timestep_spacing == "linspace":
            timesteps: NDArray[Any] = np.linspace(0, total - 1, steps + 1).round()[::-1][:-1].astype(np.int64)
        elif cfg.timestep_spacing == "leading":
            ratio = total // (steps + 1)
            timesteps = (np.arange(0, steps + 1) * ratio).round()[::-1][:-1].astype(np.int64) + cfg.steps_offset
        else:  # trailing
            timesteps = np.arange(total, 0, -total / steps).round().astype(np.int64) - 1
        train_sigmas = noise_schedule.training_sigmas(self.alphas_cumprod)
        log_train_sigmas = np.log(train_sigmas)
        if self.schedule in table_schedules.TABLE_SCHEDULES:  # ComfyUI's simple, ddim_uniform, beta
            picked, sigmas = table_schedules.table_schedule(self.schedule, steps, train_sigmas)
            timesteps = picked.astype(np.int64)
        elif self.schedule in sigma_schedules.COMPUTED_SCHEDULES:  # AYS, KL optimal, linear-quadratic
            ends = float(train_sigmas[0]), float(train_sigmas[-1])
            sigmas = sigma_schedules.computed_sigmas(self.schedule, steps, *ends)
            timesteps = noise_schedule.sigma_to_t(sigmas, log_train_sigmas).round().astype(np.int64)
        elif self.schedule in ("karras", "exponential"):
            sigma_min, sigma_max = float(train_sigmas[0]), float(train_sigmas[-1])
            if self.schedule == "karras":
                sigmas = noise_schedule.karras_sigmas(sigma_min, sigma_max, steps)
                # diffusers rounds Karras timesteps (except for squaredcos_cap_v2) ...
                fractional = noise_schedule.sigma_to_t(sigmas, log_train_sigmas)
                if cfg.beta_schedule != "squaredcos_cap_v2" or self.round_cosine_karras:
                    fractional = fractional.round()
            else:
                sigmas = noise_schedule.exponential_sigmas(sigma_min, sigma_max, steps)
                fractional = noise_schedule.sigma_to_t(sigmas, log_train_sigmas)
            # ... and otherwise truncates them when converting to int64.
            timesteps = fractional.astype(np.int64)
        else:
            sigmas = noise_schedule.interpolate_sigmas(timesteps, train_sigmas)
        self._sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        self._timesteps = timesteps
        self._outputs: list[F32] = []  # converted model outputs (x0 estimates), newest last
        self._lower_order_nums = 0

    def _add_noise(self, original: F32, noise: F32, index: int) -> F32:
        alpha_t, sigma_t = _alpha_sigma(self._sigmas[index])
        return f32(alpha_t * original + sigma_t * noise)

    def _x0(self, model_output: F32, sample: F32) -> F32:
        alpha_t, sigma_t = _alpha_sigma(self._sigmas[self._index])
        if self.prediction_type == "epsilon":
            return f32((sample - sigma_t * model_output) / alpha_t)
        return f32(alpha_t * sample - sigma_t * model_output)

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        x0 = self._x0(model_output, sample)
        self._outputs = [*self._outputs[-1:], x0]
        drawn = None
        if self.stochastic:  # A1111's s_noise scales the noise (k-diffusion: noise * ... * s_noise)
            drawn = self._draw(noise, model_output.shape) * np.float32(self.options["s_noise"])
        # The last step (to sigma 0) and the first one (no history) are first order.
        if self._lower_order_nums < 1 or i == len(self._timesteps) - 1:
            result = self._first_order(x0, sample, drawn)
        else:
            result = self._second_order(sample, drawn)
        self._lower_order_nums = min(self._lower_order_nums + 1, 2)
        return result

    def _first_order(self, x0: F32, sample: F32, drawn: F32 | None) -> F32:
        i = self._index
        alpha_t, sigma_t = _alpha_sigma(self._sigmas[i + 1])
        alpha_s, sigma_s = _alpha_sigma(self._sigmas[i])
        h = _lambda(alpha_t, sigma_t) - _lambda(alpha_s, sigma_s)
        if drawn is None:
            return f32(sigma_t / sigma_s * sample - alpha_t * (noise_schedule.exp32(-h) - ONE) * x0)
        decay = np.float32(1.0) - noise_schedule.exp32(np.float32(-2.0) * h)
        return f32(
            sigma_t / sigma_s * noise_schedule.exp32(-h) * sample
            + alpha_t * decay * x0
            + sigma_t * np.sqrt(decay) * drawn
        )

    def _second_order(self, sample: F32, drawn: F32 | None) -> F32:
        i = self._index
        alpha_t, sigma_t = _alpha_sigma(self._sigmas[i + 1])
        alpha_s0, sigma_s0 = _alpha_sigma(self._sigmas[i])
        alpha_s1, sigma_s1 = _alpha_sigma(self._sigmas[i - 1])
        lambda_t, lambda_s0 = _lambda(alpha_t, sigma_t), _lambda(alpha_s0, sigma_s0)
        lambda_s1 = _lambda(alpha_s1, sigma_s1)
        m1, m0 = self._outputs
        h, h_0 = lambda_t - lambda_s0, lambda_s0 - lambda_s1
        r0 = h_0 / h
        d0, d1 = m0, ONE / r0 * (m0 - m1)
        if drawn is None:
            coeff = alpha_t * (noise_schedule.exp32(-h) - ONE)
            return f32(sigma_t / sigma_s0 * sample - coeff * d0 - np.float32(0.5) * coeff * d1)
        decay = ONE - noise_schedule.exp32(np.float32(-2.0) * h)
        return f32(
            sigma_t / sigma_s0 * noise_schedule.exp32(-h) * sample
            + alpha_t * decay * d0
            + np.float32(0.5) * (alpha_t * decay) * d1
            + sigma_t * np.sqrt(decay) * drawn
        )


class DPMPP2M(DPMSolverMultistep):
    name = "dpmpp_2m"
    label = "DPM++ 2M"
    aliases: ClassVar[tuple[str, ...]] = ("DPM++ 2M", "k_dpmpp_2m", "dpmsolver++", "dpm_solver_multistep")


class DPMPP2MSDE(DPMSolverMultistep):
    name = "dpmpp_2m_sde"
    label = "DPM++ 2M SDE"
    # ComfyUI's dpmpp_2m_sde_gpu differs from its dpmpp_2m_sde only in where its Brownian-tree noise
    # is drawn; sdkit draws its own noise for both (see sdkit.schedulers.base.noise_from_seed).
    aliases: ClassVar[tuple[str, ...]] = ("DPM++ 2M SDE", "k_dpmpp_2m_sde", "sde-dpmsolver++", "dpmpp_2m_sde_gpu")
    stochastic = True
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = {"s_noise": 1.0}
