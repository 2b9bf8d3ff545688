"""DEIS (Zhang & Chen 2023), as diffusers' DEISMultistepScheduler (``algorithm_type="deis"``,
``solver_type="logrho"``, ``lower_order_final=True``), for discrete and flow models.

The model output is turned into a noise estimate ``eps``; each step integrates
``d(x / alpha) = eps d(rho)`` (``rho = sigma_t / alpha_t``) exactly for ``eps`` interpolated by a
Lagrange polynomial in ``log rho`` through the last ``order`` estimates. The ``order`` option
(1..3, default 3 as ComfyUI's ``deis``) is diffusers' ``solver_order``; the first steps and, below
15 steps, the last two lower it as diffusers does.

The step to sigma 0 returns the clean estimate (:mod:`sdkit.schedulers.exponential`); diffusers'
DEIS ends at the training table's sigma_min instead (its update is ``0 * inf`` at 0), so the last
step is the only one that differs from it. ComfyUI's ``deis`` ("tab" mode) interpolates ``eps`` in
the time of an EDM-fitted VP schedule and integrates the coefficients numerically: another
interpolation variable, so its images differ slightly from these.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers import noise_schedule
from sdkit.schedulers.base import NoiseFn, f32
from sdkit.schedulers.exponential import Coordinates, FlowCoordinates, VPCoordinates, checked_order, half_log_snr

F32 = NDArray[np.float32]
ONE = np.float32(1.0)


def F(value: Any) -> np.float32:
    return cast(np.float32, np.float32(value))


def _ind2(t: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """Integral of (log t - log c) / (log b - log c) dt, float32 in diffusers' operation order."""
    lt, lb, lc = np.log(t), np.log(b), np.log(c)
    return F(t * (-lc + lt - ONE) / (lb - lc))


def _ind3(t: np.float32, b: np.float32, c: np.float32, d: np.float32) -> np.float32:
    """Integral of (log t - log c)(log t - log d) / ((log b - log c)(log b - log d)) dt."""
    lt, lb, lc, ld = np.log(t), np.log(b), np.log(c), np.log(d)
    numerator = t * (lc * (ld - lt + ONE) - ld * lt + ld + lt**2 - F(2) * lt + F(2))
    return F(numerator / ((lb - lc) * (lb - ld)))


class DEISSolver(Coordinates):
    """The DEIS step on the coordinates of the class it is combined with."""

    option_defaults: ClassVar[dict[str, float]] = {"order": 3.0}
    diffusers_class = "DEISMultistepScheduler"

    def _configure(self) -> None:
        super()._configure()
        self._order = checked_order(self.name, self.options["order"], 3)

    def _reset_solver(self) -> None:
        self._history: list[F32] = []  # noise estimates, newest last
        self._warm = 0

    def _rho(self, index: int) -> np.float32:
        alpha, sigma = self._coords(self._sigmas[index])
        return F(sigma / alpha)

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i, n = self._index, len(self._timesteps)
        x0 = self._clean(model_output, sample)
        alpha_s, sigma_s = self._coords(self._sigmas[i])
        eps = f32((sample - alpha_s * x0) / sigma_s)
        self._history = [*self._history, eps][-self._order :]
        warm, self._warm = self._warm, min(self._warm + 1, self._order)
        if self._sigmas[i + 1] == 0:
            return x0
        final, second = (n < 15 and i == n - 1), (n < 15 and i == n - 2)
        if self._order == 1 or warm < 1 or final:
            return self._deis_first_order(sample, eps)
        alpha_t = self._coords(self._sigmas[i + 1])[0]
        rho_t, rho_s0, rho_s1 = self._rho(i + 1), self._rho(i), self._rho(i - 1)
        m0, m1 = self._history[-1], self._history[-2]
        if self._order == 2 or warm < 2 or second:
            coef1 = F(_ind2(rho_t, rho_s0, rho_s1) - _ind2(rho_s0, rho_s0, rho_s1))
            coef2 = F(_ind2(rho_t, rho_s1, rho_s0) - _ind2(rho_s0, rho_s1, rho_s0))
            return f32(alpha_t * (sample / alpha_s + coef1 * m0 + coef2 * m1))
        rho_s2, m2 = self._rho(i - 2), self._history[-3]
        coef1 = F(_ind3(rho_t, rho_s0, rho_s1, rho_s2) - _ind3(rho_s0, rho_s0, rho_s1, rho_s2))
        coef2 = F(_ind3(rho_t, rho_s1, rho_s2, rho_s0) - _ind3(rho_s0, rho_s1, rho_s2, rho_s0))
        coef3 = F(_ind3(rho_t, rho_s2, rho_s0, rho_s1) - _ind3(rho_s0, rho_s2, rho_s0, rho_s1))
        return f32(alpha_t * (sample / alpha_s + coef1 * m0 + coef2 * m1 + coef3 * m2))

    def _deis_first_order(self, sample: F32, eps: F32) -> F32:
        i = self._index
        alpha_t, sigma_t = self._coords(self._sigmas[i + 1])
        alpha_s, sigma_s = self._coords(self._sigmas[i])
        h = F(half_log_snr(alpha_t, sigma_t) - half_log_snr(alpha_s, sigma_s))
        return f32((alpha_t / alpha_s) * sample - (sigma_t * (noise_schedule.exp32(h) - ONE)) * eps)


class DEIS(DEISSolver, VPCoordinates):
    name = "deis"
    label = "DEIS"
    aliases: ClassVar[tuple[str, ...]] = ("DEIS", "DEISMultistep", "deis_multistep")


class DEISFlow(DEISSolver, FlowCoordinates):
    name = "deis_flow"
    label = "DEIS"
    variant_of = "deis"
