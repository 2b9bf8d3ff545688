"""The sampling algorithms of k-diffusion, as generators (see ``sdkit.schedulers.k_stepper``).

Each function is the loop of its reference over the step sigmas ``s`` (ending in 0), written in
float32 scalar arithmetic in the reference's operation order (libm-rounded log/exp, as torch on a
0-d CPU tensor), with ``yield x, sigma, i`` where the reference calls the model in step ``i``. The
references (k-diffusion 0.1.1.post1 ``k_diffusion/sampling.py``, whose code ComfyUI copies):

- ``euler``, ``dpm_2``, ``dpm_2_a``, ``dpmpp_2s_a``, ``dpmpp_3m_sde``, ``lms``, ``heun``, ``dpmpp_2m``: k-diffusion's
  ``sample_*`` with their defaults (``s_churn=0``, ``eta=1``, LMS order 4, 3M SDE eta 1);
- the algorithms only ComfyUI or A1111 have are in ``sdkit.schedulers.ui_algorithms``.

Noise: one standard-normal draw (``run.noise()``) wherever the reference calls its noise sampler,
none where it does not (the step to sigma 0), so a replay can feed the reference the same draws.
"""

from __future__ import annotations

from typing import cast

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers.base import f32
from sdkit.schedulers.k_stepper import Evaluated, Run, Steps
from sdkit.schedulers.noise_schedule import exp32, expm1_32, log32

F32 = NDArray[np.float32]
ONE = np.float32(1.0)
HALF = np.float32(0.5)
ETA = np.float32(1.0)  # the ancestral samplers' eta (k-diffusion's and ComfyUI's default)


def to_d(x: F32, denoised: F32, sigma: np.float32) -> F32:
    """k-diffusion's ``to_d``: the ODE derivative (x - denoised) / sigma."""
    return f32((x - denoised) / sigma)


def lerp_half(a: np.float32, b: np.float32) -> np.float32:
    """``torch.lerp(a, b, 0.5)`` (its CPU kernel: ``b - (b - a) * (1 - w)`` for w >= 0.5)."""
    return cast(np.float32, np.float32(b - (b - a) * HALF))


def sqrt32(x: np.float32) -> np.float32:
    return cast(np.float32, np.float32(np.sqrt(x)))


def ancestral_step(sigma_from: np.float32, sigma_to: np.float32) -> tuple[np.float32, np.float32]:
    """k-diffusion's ``get_ancestral_step`` (eta 1): (sigma_down, sigma_up)."""
    sigma_up = sqrt32(sigma_to * sigma_to * (sigma_from * sigma_from - sigma_to * sigma_to) / (sigma_from * sigma_from))
    sigma_up = sigma_up if sigma_up < sigma_to else sigma_to  # Python's min(sigma_to, up)
    return sqrt32(sigma_to * sigma_to - sigma_up * sigma_up), sigma_up


def s_noise_of(run: Run) -> np.float32:
    return cast(np.float32, np.float32(run.options.get("s_noise", 1.0)))


def dpm_2_step(ev: Evaluated, sigma: np.float32, sigma_to: np.float32, i: int) -> Steps:
    """DPM2 from ``sigma`` (the model's output ``ev`` there) to ``sigma_to``: the slope at the
    log-midpoint sigma (one more model call) carries the whole step; Euler when ``sigma_to`` is 0.
    ``sample_dpm_2`` and the ancestral DPM2 samplers (k-diffusion's, ComfyUI's ``_RF``) share it."""
    d = to_d(ev.x, ev.denoised, sigma)
    if sigma_to == 0:
        return f32(ev.x + d * np.float32(sigma_to - sigma))
    mid = exp32(lerp_half(log32(sigma), log32(sigma_to)))
    ev2 = yield f32(ev.x + d * np.float32(mid - sigma)), mid, i
    return f32(ev.x + to_d(ev2.x, ev2.denoised, mid) * np.float32(sigma_to - sigma))


# -- k-diffusion ---------------------------------------------------------------------------------


def euler(run: Run) -> Steps:
    """``sample_euler`` (``s_churn=0``: no noise): ``x += (x - denoised) / s[i] * (s[i+1] - s[i])``.
    ComfyUI's ``ddim`` sampler is this function on the model's sigmas (its ``sampler_object``)."""
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = f32(ev.x + to_d(ev.x, ev.denoised, s[i]) * np.float32(s[i + 1] - s[i]))
    return x


def heun(run: Run) -> Steps:
    """``sample_heun``: Euler to s[i+1], then the average of both slopes (Euler on the last step)."""
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x, dt = ev.x, np.float32(s[i + 1] - s[i])
        d = to_d(x, ev.denoised, s[i])
        if s[i + 1] == 0:
            x = f32(x + d * dt)
            continue
        ev2 = yield f32(x + d * dt), s[i + 1], i
        d2 = to_d(ev2.x, ev2.denoised, s[i + 1])
        x = f32(x + f32((d + d2) / np.float32(2)) * dt)
    return x


def dpm_2(run: Run) -> Steps:
    """``sample_dpm_2``: the slope at the log-midpoint sigma carries the whole step."""
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = yield from dpm_2_step(ev, s[i], s[i + 1], i)
    return x


def dpm_2_a(run: Run) -> Steps:
    """``sample_dpm_2_ancestral``: DPM2 down to sigma_down, then noise sigma_up."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        sigma_down, sigma_up = ancestral_step(s[i], s[i + 1])
        x = yield from dpm_2_step(ev, s[i], sigma_down, i)
        if sigma_down != 0:  # no draw on the step to sigma 0
            x = f32(x + f32(run.noise() * s_noise) * sigma_up)
    return x


def dpmpp_2s_a(run: Run) -> Steps:
    """``sample_dpmpp_2s_ancestral``: DPM-Solver++(2S) in t = -log sigma down to sigma_down, then noise."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = ev.x
        sigma_down, sigma_up = ancestral_step(s[i], s[i + 1])
        if sigma_down == 0:
            x = f32(x + to_d(x, ev.denoised, s[i]) * np.float32(sigma_down - s[i]))
        else:
            t, t_next = -log32(s[i]), -log32(sigma_down)
            h = np.float32(t_next - t)
            sigma_s = exp32(-np.float32(t + HALF * h))
            x2 = f32(np.float32(sigma_s / exp32(-t)) * x - expm1_32(-h * HALF) * ev.denoised)
            ev2 = yield x2, sigma_s, i
            x = f32(np.float32(exp32(-t_next) / exp32(-t)) * x - expm1_32(-h) * ev2.denoised)
        if s[i + 1] > 0:
            x = f32(x + f32(run.noise() * s_noise) * sigma_up)
    return x


def dpmpp_2m(run: Run) -> Steps:
    """``sample_dpmpp_2m``: DPM-Solver++(2M), first order on the first and the last step."""
    s, x = run.sigmas, run.x
    old: F32 | None = None
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x, denoised = ev.x, ev.denoised
        t, t_next = -log32(s[i]), -log32(s[i + 1])
        h = np.float32(t_next - t)
        ratio = np.float32(exp32(-t_next) / exp32(-t))
        if old is not None and s[i + 1] != 0:
            r = np.float32((t + log32(s[i - 1])) / h)
            half_r = np.float32(ONE / (np.float32(2) * r))
            denoised = f32((ONE + half_r) * ev.denoised - half_r * old)
        x = f32(ratio * x - expm1_32(-h) * denoised)
        old = ev.denoised
    return x


def dpmpp_3m_sde(run: Run) -> Steps:
    """``sample_dpmpp_3m_sde`` (eta 1): third-order multistep SDE in t = -log sigma; x = denoised
    on the step to sigma 0."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    eta = ETA
    den_1: F32 | None = None
    den_2: F32 | None = None
    h_1: np.float32 | None = None
    h_2: np.float32 | None = None
    h = np.float32(0)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x, denoised = ev.x, ev.denoised
        if s[i + 1] == 0:
            x = denoised
        else:
            h = np.float32(-log32(s[i + 1]) + log32(s[i]))
            h_eta = np.float32(h * (eta + ONE))
            x = f32(exp32(-h_eta) * x + (-expm1_32(-h_eta)) * denoised)
            phi_2 = np.float32(expm1_32(-h_eta) / h_eta + ONE)
            if h_2 is not None and h_1 is not None and den_1 is not None and den_2 is not None:
                r0, r1 = np.float32(h_1 / h), np.float32(h_2 / h)
                d1_0, d1_1 = f32((denoised - den_1) / r0), f32((den_1 - den_2) / r1)
                d1 = f32(d1_0 + f32(d1_0 - d1_1) * r0 / np.float32(r0 + r1))
                d2 = f32(f32(d1_0 - d1_1) / np.float32(r0 + r1))
                phi_3 = np.float32(phi_2 / h_eta - HALF)
                x = f32(x + phi_2 * d1 - phi_3 * d2)
            elif h_1 is not None and den_1 is not None:
                x = f32(x + phi_2 * f32((denoised - den_1) / np.float32(h_1 / h)))
            if eta:
                scale = sqrt32(-expm1_32(np.float32(-2) * h * eta))
                x = f32(x + f32(f32(run.noise() * s[i + 1]) * scale) * s_noise)
        den_1, den_2 = denoised, den_1
        h_1, h_2 = h, h_1
    return x


def lms_coefficient(order: int, t: NDArray[np.float64], i: int, j: int) -> float:
    """k-diffusion's ``linear_multistep_coeff``: the integral over [t[i], t[i+1]] of the Lagrange
    basis polynomial of node t[i-j] among t[i], ..., t[i-order+1]. k-diffusion integrates it with
    ``scipy.integrate.quad``; here 4-point Gauss-Legendre, exact for these degree <= 3 polynomials."""
    nodes, weights = np.polynomial.legendre.leggauss(4)
    a, b = float(t[i]), float(t[i + 1])
    tau = (b - a) / 2 * nodes + (a + b) / 2
    basis = np.ones_like(tau)
    for k in range(order):
        if k != j:
            basis *= (tau - t[i - k]) / (t[i - j] - t[i - k])
    return float((b - a) / 2 * np.sum(weights * basis))


def lms(run: Run) -> Steps:
    """``sample_lms`` (order 4): Adams-Bashforth in sigma over the last four slopes. On a flow model
    the step to sigma 0 is ``x = denoised``, as ComfyUI's ``sample_lms`` (k-diffusion integrates it)."""
    s, x = run.sigmas, run.x
    t = s.astype(np.float64)
    slopes: list[F32] = []
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = ev.x
        slopes = [*slopes, to_d(x, ev.denoised, s[i])][-4:]
        if run.flow and s[i + 1] == 0:
            x = ev.denoised
            continue
        order = min(i + 1, 4)
        coeffs = [np.float32(lms_coefficient(order, t, i, j)) for j in range(order)]
        total = f32(coeffs[0] * slopes[-1])
        for coeff, slope in zip(coeffs[1:], reversed(slopes[:-1]), strict=False):
            total = f32(total + coeff * slope)
        x = f32(x + total)
    return x
