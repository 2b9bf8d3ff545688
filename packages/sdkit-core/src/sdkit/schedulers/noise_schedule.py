"""The training noise schedule (betas, alphas_cumprod) and the inference sigma schedules.

Everything here reproduces diffusers' numerics bit for bit where it can: diffusers builds
betas with ``torch.linspace`` in float32 (whose CPU kernel rounds ``start + step * i`` once,
like a fused multiply-add), takes ``torch.cumprod`` (which accumulates in float64 on CPU),
and then mixes float32 arrays with float64 numpy helpers. The comments say where each
dtype comes from, because changing one of them moves results by more than the 1e-6 the
golden tests allow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import OptionError

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
TIMESTEP_SPACINGS = ("linspace", "leading", "trailing")


def torch_linspace_f32(start: float, end: float, steps: int) -> F32:
    """``torch.linspace(start, end, steps, dtype=torch.float32)`` on CPU, exactly.

    The kernel uses float32 ``start``, ``end`` and ``step``, fills the first half as
    ``start + step * i`` and the second as ``end - step * (steps - 1 - i)``, each rounded
    once (the compiled kernel fuses the multiply-add).
    """
    if steps == 1:
        return np.array([start], dtype=np.float32)
    start32, end32 = np.float32(start), np.float32(end)
    step32 = np.float32((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps, dtype=np.float64)
    first = np.float64(start32) + np.float64(step32) * index
    second = np.float64(end32) - np.float64(step32) * (steps - 1 - index)
    return np.asarray(np.where(index < steps // 2, first, second), dtype=np.float32)


def _cosine_betas(num_train_timesteps: int, max_beta: float = 0.999) -> F32:
    """diffusers' ``betas_for_alpha_bar`` (the "squaredcos_cap_v2" schedule), in Python floats."""

    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = []
    for i in range(num_train_timesteps):
        t1, t2 = i / num_train_timesteps, (i + 1) / num_train_timesteps
        betas.append(min(1 - alpha_bar(t2) / alpha_bar(t1), max_beta))
    return np.array(betas, dtype=np.float32)


def training_betas(
    num_train_timesteps: int,
    beta_start: float,
    beta_end: float,
    beta_schedule: str,
    trained_betas: Sequence[float] | None = None,
) -> F32:
    """The per-timestep betas the model was trained with, float32 like diffusers."""
    if trained_betas is not None:
        betas = np.asarray(trained_betas, dtype=np.float32)
        if betas.ndim != 1 or betas.size != num_train_timesteps:
            raise OptionError(f"trained_betas must hold num_train_timesteps={num_train_timesteps} numbers")
        return betas
    if beta_schedule == "linear":
        return torch_linspace_f32(beta_start, beta_end, num_train_timesteps)
    if beta_schedule == "scaled_linear":
        root = torch_linspace_f32(beta_start**0.5, beta_end**0.5, num_train_timesteps)
        return (root * root).astype(np.float32)
    if beta_schedule == "squaredcos_cap_v2":
        return _cosine_betas(num_train_timesteps)
    raise OptionError(f"beta_schedule {beta_schedule!r} is not supported; use one of {', '.join(BETA_SCHEDULES)}")


def cumulative_alphas(betas: F32) -> F32:
    """``torch.cumprod(1 - betas)``: float32 in and out, accumulated in float64 on CPU."""
    alphas = (np.float32(1.0) - betas).astype(np.float32)
    return np.asarray(np.cumprod(alphas.astype(np.float64)), dtype=np.float32)


def training_sigmas(alphas_cumprod: F32) -> F32:
    """k-diffusion sigmas of every training timestep, ascending (float32 like diffusers)."""
    return np.asarray(np.sqrt((np.float32(1.0) - alphas_cumprod) / alphas_cumprod), dtype=np.float32)


def spaced_timesteps(
    spacing: str,
    num_inference_steps: int,
    num_train_timesteps: int,
    steps_offset: int,
    dtype: type[np.floating[Any]] = np.float32,
) -> F64:
    """The k-diffusion schedulers' timestep spacings, descending, returned as float64.

    ``dtype`` is the precision diffusers computes them in: float32 for Euler and Heun,
    float64 for DPMSolverSDE (799.2 and float32(799.2) interpolate different sigmas).
    """
    n, total = num_inference_steps, num_train_timesteps
    if spacing == "linspace":
        spaced = np.linspace(0, total - 1, n, dtype=dtype)[::-1]
    elif spacing == "leading":
        spaced = (np.arange(0, n) * (total // n)).round()[::-1].astype(dtype) + steps_offset
    elif spacing == "trailing":
        spaced = np.arange(total, 0, -total / n).round().astype(dtype) - 1
    else:
        raise OptionError(f"timestep_spacing {spacing!r} is not supported; use one of {', '.join(TIMESTEP_SPACINGS)}")
    return np.asarray(spaced, dtype=np.float64)


def interpolate_sigmas(timesteps: NDArray[np.floating] | NDArray[np.integer], train_sigmas: F32) -> F64:
    """Linear interpolation of the training sigmas at (fractional) timesteps, float64."""
    return np.asarray(np.interp(timesteps, np.arange(0, len(train_sigmas)), train_sigmas), dtype=np.float64)


def karras_sigmas(sigma_min: float, sigma_max: float, n: int, rho: float = 7.0) -> F64:
    """Karras et al. (2022) schedule: evenly spaced in sigma ** (1 / rho)."""
    ramp = np.linspace(0, 1, n)
    min_inv_rho = sigma_min ** (1 / rho)
    max_inv_rho = sigma_max ** (1 / rho)
    return np.asarray((max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho, dtype=np.float64)


def exponential_sigmas(sigma_min: float, sigma_max: float, n: int) -> F64:
    """Evenly spaced in log sigma."""
    return np.asarray(np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n)), dtype=np.float64)


def sigma_to_t(sigmas: F64, log_train_sigmas: F32) -> F64:
    """Fractional training timestep of each sigma (piecewise-linear in log sigma), float64.

    One sigma at a time, as diffusers does: numpy's log of a scalar and of an array can
    differ in the last bit (SIMD), which moves a timestep by ~1e-5.
    """
    return np.array([_one_sigma_to_t(sigma, log_train_sigmas) for sigma in sigmas], dtype=np.float64)


def _one_sigma_to_t(sigma: np.float64, log_train_sigmas: F32) -> float:
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_train_sigmas[:, np.newaxis]
    low = int(np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_train_sigmas.shape[0] - 2)[0])
    low_log, high_log = log_train_sigmas[low], log_train_sigmas[low + 1]
    w = np.clip((low_log - log_sigma) / (low_log - high_log), 0, 1)
    return float((1 - w) * low + w * (low + 1))


# Scalar float32 transcendentals as torch computes them on a 0-d CPU tensor (libm's
# correctly rounded expf/logf). numpy's SIMD float32 exp/log may be 1-2 ulp off, which
# the solvers amplify past 1e-6; rounding the float64 result once reproduces libm.
def log32(x: float | np.floating[Any]) -> np.float32:
    value = float(x)
    return cast(np.float32, np.float32(-math.inf if value == 0.0 else math.log(value)))


def exp32(x: float | np.floating[Any]) -> np.float32:
    value = float(x)
    return cast(np.float32, np.float32(math.inf if value > 700.0 else math.exp(value)))


def expm1_32(x: float | np.floating[Any]) -> np.float32:
    value = float(x)
    return cast(np.float32, np.float32(math.inf if value > 700.0 else math.expm1(value)))
