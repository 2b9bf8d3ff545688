"""UniPC (Zhao et al. 2023), as diffusers' UniPCMultistepScheduler (``predict_x0=True``,
``lower_order_final=True``, corrector on every step), for discrete and flow models.

Each step first corrects the previous step's result with the new model output (UniC), then
predicts the next sample (UniP) from the last ``order`` clean estimates. ``B(h)`` is ``h``
("bh1", ComfyUI's ``uni_pc`` and A1111's "UniPC" default) or ``expm1(h)`` ("bh2", ComfyUI's
``uni_pc_bh2``). The ``order`` option (1..3, default 3 as A1111's and ComfyUI's) is diffusers'
``solver_order``; warm-up and the final steps lower it as diffusers does. The config's
``solver_type`` / ``solver_order`` are not read: the sampler name and option pick them.

Schedules and coordinates: :mod:`sdkit.schedulers.exponential` (the step to sigma 0 returns the
clean estimate: diffusers' bh1 gives NaN there, ``0 * inf``; bh2 gives the same value). ComfyUI
runs its own port of the original UniPC code (time-continuous noise schedule interpolated from the
training table, another handling of the last step), and A1111 its own on discrete timesteps, so
their images differ slightly from these (the same algorithm, not the same rounding or schedule).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers import noise_schedule
from sdkit.schedulers.base import NoiseFn, f32
from sdkit.schedulers.exponential import Coordinates, FlowCoordinates, VPCoordinates, checked_order, half_log_snr

F32 = NDArray[np.float32]
ONE = np.float32(1.0)
HALF = np.float32(0.5)


class UniPCSolver(Coordinates):
    """The UniPC step on the coordinates of the class it is combined with."""

    solver_type: ClassVar[str] = "bh1"
    option_defaults: ClassVar[dict[str, float]] = {"order": 3.0}
    diffusers_class = "UniPCMultistepScheduler"

    def _configure(self) -> None:
        super()._configure()
        self._order = checked_order(self.name, self.options["order"], 3)

    def _reset_solver(self) -> None:
        self._history: list[F32] = []  # clean estimates, newest last
        self._last_sample: F32 | None = None
        self._this_order = 0
        self._warm = 0  # diffusers' lower_order_nums

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        x0 = self._clean(model_output, sample)
        if self._last_sample is not None:  # UniC: correct the previous step with this model output
            sample = self._correct(x0, self._last_sample, self._this_order)
        self._history = [*self._history, x0][-self._order :]
        self._this_order = min(self._order, len(self._timesteps) - i, self._warm + 1)
        self._last_sample = sample.copy()  # the caller may reuse its array (the corrector reads it next step)
        self._warm = min(self._warm + 1, self._order)
        if self._sigmas[i + 1] == 0:
            return x0
        return self._predict(sample, self._this_order)

    def _lambda(self, index: int) -> np.float32:
        return half_log_snr(*self._coords(self._sigmas[index]))

    def _coefficients(self, h: np.float32, rks: list[np.float32]) -> tuple[np.float32, np.float32, F32, F32]:
        """(h*phi_1(-h), B(h), R, b) of diffusers' update for step ``h`` and ratios ``rks`` (with the final 1)."""
        hh = np.float32(-h)
        h_phi_1 = noise_schedule.expm1_32(hh)
        h_phi_k = np.float32(h_phi_1 / hh - ONE)
        b_h = hh if self.solver_type == "bh1" else noise_schedule.expm1_32(hh)
        factorial = 1
        rows, b = [], []
        for k in range(1, len(rks) + 1):
            rows.append([r ** (k - 1) if k > 1 else ONE for r in rks])
            b.append(np.float32(h_phi_k * np.float32(factorial) / b_h))
            factorial *= k + 1
            h_phi_k = np.float32(h_phi_k / hh - np.float32(1 / factorial))
        return h_phi_1, b_h, np.array(rows, dtype=np.float32), np.array(b, dtype=np.float32)

    def _differences(
        self, t: int, s0: int, earlier: list[int], m0: F32
    ) -> tuple[np.float32, list[np.float32], list[F32]]:
        """h, the ratios r_k and the scaled differences D1_k of the earlier estimates."""
        lambda_s0 = self._lambda(s0)
        h = np.float32(self._lambda(t) - lambda_s0)
        rks, d1s = [], []
        for k, index in enumerate(earlier, start=2):
            rk = np.float32((self._lambda(index) - lambda_s0) / h)
            rks.append(rk)
            d1s.append(f32((self._history[-k] - m0) / rk))
        return h, [*rks, ONE], d1s

    def _base(self, t: int, s0: int, x: F32, m0: F32, h_phi_1: np.float32) -> F32:
        alpha_t, sigma_t = self._coords(self._sigmas[t])
        _, sigma_s0 = self._coords(self._sigmas[s0])
        return f32((sigma_t / sigma_s0) * x - (alpha_t * h_phi_1) * m0)

    def _predict(self, x: F32, order: int) -> F32:
        """UniP from index i to i + 1 (diffusers' multistep_uni_p_bh_update)."""
        i = self._index
        m0 = self._history[-1]
        h, rks, d1s = self._differences(i + 1, i, [i - k for k in range(1, order)], m0)
        h_phi_1, b_h, rows, b = self._coefficients(h, rks)
        x_t = self._base(i + 1, i, x, m0, h_phi_1)
        if not d1s:
            return x_t
        rhos = np.array([HALF]) if order == 2 else _solve(rows[:-1, :-1], b[:-1])
        residual = _weighted(rhos, d1s)
        alpha_t, _ = self._coords(self._sigmas[i + 1])
        return f32(x_t - (alpha_t * b_h) * residual)

    def _correct(self, model_t: F32, last: F32, order: int) -> F32:
        """UniC of the step from index i - 1 to i (diffusers' multistep_uni_c_bh_update): the
        predictor's result is replaced by the corrected one, from ``last`` (the sample at i - 1)."""
        i = self._index
        m0 = self._history[-1]
        h, rks, d1s = self._differences(i, i - 1, [i - k - 1 for k in range(1, order)], m0)
        h_phi_1, b_h, rows, b = self._coefficients(h, rks)
        rhos = np.array([HALF]) if order == 1 else _solve(rows, b)
        x_t = self._base(i, i - 1, last, m0, h_phi_1)
        correction = f32(rhos[-1] * f32(model_t - m0))
        if d1s:
            correction = f32(_weighted(rhos[:-1], d1s) + correction)
        alpha_t, _ = self._coords(self._sigmas[i])
        return f32(x_t - (alpha_t * b_h) * correction)


def _solve(rows: F32, b: F32) -> F32:
    """diffusers' float32 ``torch.linalg.solve``, solved in float64 and rounded (LAPACK builds
    round float32 solves differently; this is as exact as float32 allows)."""
    return np.linalg.solve(rows.astype(np.float64), b.astype(np.float64)).astype(np.float32)


def _weighted(weights: NDArray[Any], arrays: list[F32]) -> F32:
    total = f32(np.float32(weights[0]) * arrays[0])
    for weight, array in zip(weights[1:], arrays[1:], strict=True):
        total = f32(total + np.float32(weight) * array)
    return total


_UNIPC_SETTINGS: tuple[tuple[str, object], ...] = (
    ("lower_order_final", True),
    ("predict_x0", True),
    ("disable_corrector", []),
)


class UniPC(UniPCSolver, VPCoordinates):
    name = "uni_pc"
    required_settings = _UNIPC_SETTINGS
    label = "UniPC"
    aliases: ClassVar[tuple[str, ...]] = ("UniPC", "unipc", "uni_pc_bh1", "UniPCMultistep", "unipc_multistep")


class UniPCBh2(UniPCSolver, VPCoordinates):
    name = "uni_pc_bh2"
    required_settings = _UNIPC_SETTINGS
    label = "UniPC bh2"
    aliases: ClassVar[tuple[str, ...]] = ("UniPC bh2", "unipc_bh2")
    solver_type = "bh2"


class UniPCFlow(UniPCSolver, FlowCoordinates):
    name = "uni_pc_flow"
    label = "UniPC"
    variant_of = "uni_pc"


class UniPCBh2Flow(UniPCSolver, FlowCoordinates):
    name = "uni_pc_bh2_flow"
    label = "UniPC bh2"
    variant_of = "uni_pc_bh2"
    solver_type = "bh2"
