"""What the exponential-integrator multistep samplers (UniPC, DEIS) share, for discrete and flow models.

Both work in the parameterisation ``x_t = alpha_t * x0 + sigma_t * eps`` with the half log-SNR
``lambda = log(alpha_t) - log(sigma_t)``. Only the map from a schedule sigma to ``(alpha_t,
sigma_t)`` and the model's ``x0`` estimate differ by model kind:

- discrete-time models (k-diffusion sigma ``s``): ``alpha_t = 1 / sqrt(s^2 + 1)``,
  ``sigma_t = s * alpha_t`` (:class:`VPCoordinates`, the schedule of ``DPMSolverMultistep``);
- flow-matching models (flow sigma ``s``): ``alpha_t = 1 - s``, ``sigma_t = s``, ``x0 = x - s * v``
  (:class:`FlowCoordinates`, the schedule, shift and ``mu`` of ``FlowMatchEuler``), as diffusers'
  ``use_flow_sigmas`` / ``prediction_type="flow_prediction"``. A first sigma of 1 (``alpha_t = 0``,
  ``lambda = -inf``) is moved to ``1 - 1e-6`` as diffusers' UniPCMultistepScheduler does.

The step to sigma 0 (the last one) returns the model's clean estimate ``x0``: it is the limit of
every such update (``sigma_t = 0``, ``alpha_t = 1``), which diffusers' UniPC bh1 and DEIS cannot
evaluate there (``0 * inf``; diffusers' DEIS therefore stops at sigma_min).
"""

from __future__ import annotations

from typing import ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import OptionError
from sdkit.schedulers import noise_schedule
from sdkit.schedulers.base import Scheduler, f32
from sdkit.schedulers.dpm_solver import DPMSolverMultistep, _alpha_sigma
from sdkit.schedulers.flow_match import FlowMatchEuler

F32 = NDArray[np.float32]
ONE = np.float32(1.0)
FLOW_FIRST_SIGMA_OFFSET = 1e-6


def half_log_snr(alpha_t: np.float32, sigma_t: np.float32) -> np.float32:
    """``log(alpha_t) - log(sigma_t)`` in float32 (+inf at sigma_t 0), as diffusers computes it."""
    return cast(np.float32, noise_schedule.log32(alpha_t) - noise_schedule.log32(sigma_t))


def checked_order(sampler: str, value: float, most: int) -> int:
    """The ``order`` option as an integer in 1..most, else OptionError."""
    if not float(value).is_integer() or not 1 <= value <= most:
        raise OptionError(f"sampler {sampler!r} option order must be an integer in 1..{most}, got {value:g}")
    return int(value)


class Coordinates(Scheduler):
    """The interface the solvers use (provided by the two classes below)."""

    def _coords(self, sigma: np.float32) -> tuple[np.float32, np.float32]:
        raise NotImplementedError

    def _clean(self, model_output: F32, sample: F32) -> F32:
        raise NotImplementedError

    def _reset_solver(self) -> None:
        """Forget the history of model outputs (a new ``set_timesteps``)."""


class VPCoordinates(DPMSolverMultistep, Coordinates):
    """Discrete-time models on DPMSolverMultistep's schedules (UniPC's and DEIS's diffusers
    classes build the same timesteps and sigmas, and round Karras timesteps for every beta schedule)."""

    round_cosine_karras: ClassVar[bool] = True
    required_settings: ClassVar[tuple[tuple[str, object], ...]] = (("lower_order_final", True),)

    def _coords(self, sigma: np.float32) -> tuple[np.float32, np.float32]:
        return _alpha_sigma(sigma)

    def _clean(self, model_output: F32, sample: F32) -> F32:
        return self._x0(model_output, sample)

    def _build(self, steps: int, strength: float) -> None:
        super()._build(steps, strength)
        self._reset_solver()


class FlowCoordinates(FlowMatchEuler, Coordinates):
    """Flow-matching models on FlowMatchEuler's schedules (shift, ``mu``, ``sigmas=``)."""

    aliases: ClassVar[tuple[str, ...]] = ()  # not FlowMatchEuler's: a flow variant answers to its sampler's names

    def _coords(self, sigma: np.float32) -> tuple[np.float32, np.float32]:
        return cast(np.float32, ONE - sigma), sigma

    def _clean(self, model_output: F32, sample: F32) -> F32:
        return f32(sample - self._sigmas[self._index] * model_output)

    def _build(self, steps: int, strength: float) -> None:
        super()._build(steps, strength)
        if abs(float(self._sigmas[0]) - 1.0) < FLOW_FIRST_SIGMA_OFFSET:
            self._sigmas[0] = np.float32(float(self._sigmas[0]) - FLOW_FIRST_SIGMA_OFFSET)
            self._timesteps[0] = self._sigmas[0] * np.float32(self.config.num_train_timesteps)
        self._reset_solver()
