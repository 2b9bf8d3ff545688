"""The sampling algorithms only ComfyUI or A1111 have, as generators (see ``sdkit.schedulers.k_stepper``).

Written like ``sdkit.schedulers.k_algorithms`` (float32 in the reference's operation order, one noise
draw where the reference draws), each with its algorithm written out in its docstring. References:
ComfyUI ``comfy/k_diffusion/sampling.py`` (``sample_*_RF``, ``sample_heunpp2``, ``sample_ddpm``, ``sample_lcm``,
``sample_euler_cfg_pp``, ``sample_dpmpp_2m_cfg_pp``, and ``sample_dpmpp_sde`` / ``_2m_sde`` / ``_3m_sde`` with
``CONST`` model sampling); A1111 ``modules/sd_samplers_extra.py``
(``restart_sampler``).

ComfyUI's rectified-flow ancestral variants (``*_rf``), which it runs instead of the plain ones on
flow models: the step goes down to ``sigma_down = s[i+1]^2 / s[i]`` by mixing ``x`` and the x0
estimate, then rescales by ``(1 - s[i+1]) / (1 - sigma_down)`` and adds noise
``sqrt(s[i+1]^2 - sigma_down^2 (1 - s[i+1])^2 / (1 - sigma_down)^2)`` so the flow marginal holds.
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers.base import f32
from sdkit.schedulers.k_algorithms import ETA, HALF, ONE, ancestral_step, dpm_2_step, s_noise_of, sqrt32, to_d
from sdkit.schedulers.k_stepper import Run, Steps
from sdkit.schedulers.noise_schedule import exp32, expm1_32, log32, torch_linspace_f32

F32 = NDArray[np.float32]


def rf_ancestral_step(sigma: np.float32, sigma_next: np.float32) -> tuple[np.float32, np.float32, np.float32]:
    """ComfyUI's rectified-flow ancestral step (eta 1): (sigma_down, rescale, renoise coefficient)."""
    sigma_down = sigma_next * (ONE + (sigma_next / sigma - ONE) * ETA)
    alpha_next, alpha_down = ONE - sigma_next, ONE - sigma_down
    renoise = sqrt32(
        sigma_next * sigma_next - sigma_down * sigma_down * (alpha_next * alpha_next) / (alpha_down * alpha_down)
    )
    return sigma_down, np.float32(alpha_next / alpha_down), renoise


# -- ComfyUI's rectified-flow ancestral samplers --------------------------------------------------


def euler_a_rf(run: Run) -> Steps:
    """``sample_euler_ancestral_RF``: x <- (sd / s) x + (1 - sd / s) denoised, rescale, renoise."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        if s[i + 1] == 0:
            x = ev.denoised
            continue
        sigma_down, rescale, renoise = rf_ancestral_step(s[i], s[i + 1])
        ratio = np.float32(sigma_down / s[i])
        x = f32(ratio * ev.x + (ONE - ratio) * ev.denoised)
        x = f32(rescale * x + f32(run.noise() * s_noise) * renoise)
    return x


def dpm_2_a_rf(run: Run) -> Steps:
    """``sample_dpm_2_ancestral_RF``: DPM2 down to sigma_down (log-midpoint slope), rescale, renoise."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        sigma_down, rescale, renoise = rf_ancestral_step(s[i], s[i + 1])
        x = yield from dpm_2_step(ev, s[i], sigma_down, i)
        if sigma_down != 0:  # no rescale, no draw on the step to sigma 0
            x = f32(rescale * x + f32(run.noise() * s_noise) * renoise)
    return x


def dpmpp_2s_a_rf(run: Run) -> Steps:
    """``sample_dpmpp_2s_ancestral_RF``: the midpoint sigma_s halves lambda = log((1 - sigma) / sigma)
    between s[i] and sigma_down (0.9999 when s[i] is 1), x mixes towards each x0 estimate."""
    s, x, s_noise = run.sigmas, run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = ev.x
        sigma_down, rescale, renoise = rf_ancestral_step(s[i], s[i + 1])
        if s[i + 1] == 0:
            x = f32(x + to_d(x, ev.denoised, s[i]) * np.float32(sigma_down - s[i]))
            continue
        if s[i] == ONE:
            sigma_s = np.float32(0.9999)
        else:
            lambda_i, lambda_down = log32((ONE - s[i]) / s[i]), log32((ONE - sigma_down) / sigma_down)
            lambda_s = np.float32(lambda_i + HALF * np.float32(lambda_down - lambda_i))
            sigma_s = np.float32(ONE / np.float32(exp32(lambda_s) + ONE))
        ratio_s = np.float32(sigma_s / s[i])
        ev2 = yield f32(ratio_s * x + (ONE - ratio_s) * ev.denoised), sigma_s, i
        ratio_down = np.float32(sigma_down / s[i])
        x = f32(ratio_down * x + (ONE - ratio_down) * ev2.denoised)
        x = f32(rescale * x + f32(run.noise() * s_noise) * renoise)
    return x


# -- ComfyUI only ---------------------------------------------------------------------------------


def heunpp2(run: Run) -> Steps:
    """ComfyUI's ``sample_heunpp2`` (from sd-webui-samplers-scheduler), s_churn 0. With d_k the slope
    at the k-th evaluation and dt = s[i+1] - s[i]:

    - last step (s[i+1] is the final sigma): Euler, x + d dt;
    - next to last (s[i+2] final): x2 = x + d dt, evaluate at s[i+1];
      x + (d w1 + d2 w2) dt with w2 = s[i+1] / (2 s[0]), w1 = 1 - w2;
    - otherwise: x2 = x + d dt at s[i+1], x3 = x2 + d2 (s[i+2] - s[i+1]) at s[i+2];
      x + (w1 d + w2 d2 + w3 d3) dt with w2 = s[i+1] / (3 s[0]), w3 = s[i+2] / (3 s[0]),
      w1 = 1 - w2 - w3.

    Three model calls per step but the last two. ``s[0]`` is the first sigma of the run (img2img:
    of the tail)."""
    s, x = run.sigmas, run.x
    s_end = s[-1]
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = ev.x
        d, dt = to_d(x, ev.denoised, s[i]), np.float32(s[i + 1] - s[i])
        if s[i + 1] == s_end:
            x = f32(x + d * dt)
            continue
        ev2 = yield f32(x + d * dt), s[i + 1], i
        d2 = to_d(ev2.x, ev2.denoised, s[i + 1])
        if s[i + 2] == s_end:
            w2 = np.float32(s[i + 1] / np.float32(2 * s[0]))
            x = f32(x + f32(d * (ONE - w2) + d2 * w2) * dt)
            continue
        ev3 = yield f32(ev2.x + d2 * np.float32(s[i + 2] - s[i + 1])), s[i + 2], i
        d3 = to_d(ev3.x, ev3.denoised, s[i + 2])
        w = np.float32(3 * s[0])
        w2, w3 = np.float32(s[i + 1] / w), np.float32(s[i + 2] / w)
        w1 = np.float32(ONE - w2 - w3)
        x = f32(x + f32(w1 * d + w2 * d2 + w3 * d3) * dt)
    return x


def ddpm(run: Run) -> Steps:
    """ComfyUI's ``sample_ddpm`` (``generic_step_sampler`` with ``DDPMSampler_step``): ancestral DDPM
    on the variance-preserving sample. With eps = (x - denoised) / s[i], x_vp = x / sqrt(1 + s[i]^2),
    a = 1 / (s^2 + 1) at s[i] and a' at s[i+1], alpha = a / a':

        mu = sqrt(1 / alpha) (x_vp - (1 - alpha) eps / sqrt(1 - a))
        mu += sqrt((1 - alpha) (1 - a') / (1 - a)) z        (unless s[i+1] = 0; z ~ N(0, 1))
        x = mu sqrt(1 + s[i+1]^2)                          (mu itself at s[i+1] = 0)

    the posterior mean and "fixed_small" variance of diffusers' DDPMScheduler."""
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        sigma, sigma_prev = s[i], s[i + 1]
        eps = to_d(ev.x, ev.denoised, sigma)
        x_vp = f32(ev.x / sqrt32(ONE + sigma * sigma))
        acp = np.float32(ONE / (sigma * sigma + ONE))
        acp_prev = np.float32(ONE / (sigma_prev * sigma_prev + ONE))
        alpha = np.float32(acp / acp_prev)
        mu = f32(sqrt32(ONE / alpha) * f32(x_vp - f32((ONE - alpha) * eps) / sqrt32(ONE - acp)))
        if sigma_prev > 0:
            scale = sqrt32(np.float32((ONE - alpha) * (ONE - acp_prev) / (ONE - acp)))
            mu = f32(mu + scale * run.noise())
            mu = f32(mu * sqrt32(ONE + sigma_prev * sigma_prev))
        x = mu
    return x


def lcm(run: Run) -> Steps:
    """ComfyUI's ``sample_lcm``: each step takes the x0 estimate and, unless the next sigma is 0,
    re-noises it there with a fresh draw z through the model's ``noise_scaling``: an epsilon / v
    model's ``x = denoised + s[i+1] z``, a flow model's (``CONST``) ``x = s[i+1] z + (1 - s[i+1])
    denoised``, the flow interpolation at s[i+1]. (ComfyUI's options s_noise, s_noise_end and
    noise_clip_std keep their defaults, which leave z as drawn.)"""
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x = ev.denoised
        if s[i + 1] > 0:
            if run.flow:
                x = f32(f32(s[i + 1] * run.noise()) + f32(np.float32(ONE - s[i + 1]) * x))
            else:
                x = f32(x + s[i + 1] * run.noise())
    return x


def _half_log_snr(sigma: np.float32, flow: bool) -> np.float32:
    """ComfyUI's ``sigma_to_half_log_snr``: -log sigma, or -logit sigma for a flow model."""
    if not flow:
        return cast(np.float32, -log32(sigma))
    with np.errstate(divide="ignore"):  # sigma 1: -logit(1) = -inf, alpha 0, as torch
        return cast(np.float32, -log32(np.float32(sigma / (ONE - sigma))))


def euler_cfg_pp(run: Run) -> Steps:
    """ComfyUI's ``sample_euler_cfg_pp`` (its ``sample_euler_ancestral_cfg_pp`` with eta 0): the step
    renoises with the *unguided* estimate u. alpha(sigma) = sigma exp(lambda(sigma)), lambda the half
    log-SNR (~1 for sigma models, 1 - sigma for flow ones), a = alpha(s[i]), b = alpha(s[i+1]):

        d = (x - a u) / s[i];   x = b denoised + (b (s[i+1] / b)) d      (x = denoised at s[i+1] = 0)
    """
    s, x = run.sigmas, run.x
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        if s[i + 1] == 0:
            x = ev.denoised
            continue
        alpha_s = np.float32(s[i] * exp32(_half_log_snr(s[i], run.flow)))
        alpha_t = np.float32(s[i + 1] * exp32(_half_log_snr(s[i + 1], run.flow)))
        d = to_d(ev.x, f32(alpha_s * ev.uncond), s[i])
        sigma_down = np.float32(alpha_t * np.float32(s[i + 1] / alpha_t))
        x = f32(alpha_t * ev.denoised + sigma_down * d)
    return x


def dpmpp_2m_cfg_pp(run: Run) -> Steps:
    """ComfyUI's ``sample_dpmpp_2m_cfg_pp``: DPM++ 2M whose renoising uses the unguided estimate u.
    With t = -log sigma, h = t(s[i+1]) - t(s[i]), r = (t(s[i]) - t(s[i-1])) / h, u' the previous u:

        mix = -exp(-h) u                                                (first step, step to 0)
        mix = -exp(-h) u - expm1(-h) (1 / (2 r)) (denoised - u')         (otherwise)
        x = denoised + mix + exp(-h) x
    """
    s, x = run.sigmas, run.x
    old: F32 | None = None
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        t, t_next = -log32(s[i]), -log32(s[i + 1])
        h = np.float32(t_next - t)
        decay = exp32(-h)
        mix = f32(-decay * ev.uncond)
        if old is not None and s[i + 1] != 0:
            r = np.float32((t + log32(s[i - 1])) / h)
            factor = np.float32(expm1_32(-h) * np.float32(ONE / (np.float32(2) * r)))
            mix = f32(mix - factor * f32(ev.denoised - old))
        x = f32(ev.denoised + mix + decay * ev.x)
        old = ev.uncond
    return x


def offset_first_sigma_for_snr(run: Run) -> F32:
    """ComfyUI's ``offset_first_sigma_for_snr``: on a flow model a first sigma >= 1 (whose half
    log-SNR -logit(1) is -inf) becomes ``run.snr_first_sigma``; the model is evaluated there."""
    s: F32 = run.sigmas
    if run.snr_first_sigma is None or len(s) <= 1 or s[0] < ONE:
        return s
    s = s.copy()
    s[0] = run.snr_first_sigma
    return s


def dpmpp_sde_rf(run: Run, order: int) -> Steps:
    """ComfyUI's ``sample_dpmpp_2m_sde`` (midpoint; ``order`` 2) and ``sample_dpmpp_3m_sde`` (``order``
    3) on a flow model (``CONST``), eta 1, in the half log-SNR lambda = log((1 - sigma) / sigma) on
    :func:`offset_first_sigma_for_snr`'s sigmas s. Per step, with D the x0 estimate, h = lambda(s[i+1])
    - lambda(s[i]), h_eta = 2 h, alpha = 1 - s[i+1] (= s[i+1] exp(lambda(s[i+1]))), e = -expm1(-h_eta):

        x <- (s[i+1] / s[i]) exp(-h) x + alpha e D                          (x = D on the step to 0)
        2M, from the second step (r = h_prev / h):  x += (alpha e / 2) (1 / r) (D - D_prev)
        3M, second step: x += alpha phi2 (D - D_prev) / r  with phi2 = expm1(-h_eta) / h_eta + 1;
            from the third (r0 = h_prev / h, r1 = h_prev2 / h, d0 = (D - D_prev) / r0,
            d1' = (D_prev - D_prev2) / r1, phi3 = phi2 / h_eta - 1/2):
            x += alpha phi2 (d0 + (d0 - d1') r0 / (r0 + r1)) - alpha phi3 (d0 - d1') / (r0 + r1)
        x += z s[i+1] sqrt(-expm1(-2 h)) s_noise    (z ~ N(0, 1); no draw when s_noise is 0)

    The worked example of a 4-step case is in ``sdkit.schedulers.k_solvers``."""
    s, x, s_noise = offset_first_sigma_for_snr(run), run.x, s_noise_of(run)
    eta = ETA
    history: list[tuple[F32, np.float32]] = []  # (x0 estimate, its step's h), newest first
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x, denoised = ev.x, ev.denoised
        if s[i + 1] == 0:
            x = denoised
            continue
        lambda_s, lambda_t = _half_log_snr(s[i], True), _half_log_snr(s[i + 1], True)
        h = np.float32(lambda_t - lambda_s)
        h_eta = np.float32(h * np.float32(eta + ONE))
        alpha_t = np.float32(s[i + 1] * exp32(lambda_t))
        decay = -expm1_32(-h_eta)
        x = f32(
            np.float32(np.float32(s[i + 1] / s[i]) * exp32(np.float32(-h * eta))) * x + (alpha_t * decay) * denoised
        )
        x = _sde_correction(x, denoised, history, h, h_eta, alpha_t, order)
        if eta > 0 and s_noise > 0:
            scale = sqrt32(-expm1_32(np.float32(np.float32(-2) * h * eta)))
            x = f32(x + f32(f32(run.noise() * s[i + 1]) * scale) * s_noise)
        history = [(denoised, h), *history][:2]
    return x


def _sde_correction(
    x: F32,
    denoised: F32,
    history: list[tuple[F32, np.float32]],
    h: np.float32,
    h_eta: np.float32,
    alpha_t: np.float32,
    order: int,
) -> F32:
    """The multistep terms of :func:`dpmpp_sde_rf` (ComfyUI's operation order)."""
    if not history:
        return x
    den_1, h_1 = history[0]
    if order == 2:
        r = np.float32(h_1 / h)
        coeff = np.float32(np.float32(np.float32(HALF * alpha_t) * -expm1_32(-h_eta)) * np.float32(ONE / r))
        return f32(x + coeff * f32(denoised - den_1))
    phi_2 = np.float32(np.float32(expm1_32(-h_eta) / h_eta) + ONE)
    if len(history) == 1:
        return f32(x + np.float32(alpha_t * phi_2) * f32(f32(denoised - den_1) / np.float32(h_1 / h)))
    den_2, h_2 = history[1]
    r0, r1 = np.float32(h_1 / h), np.float32(h_2 / h)
    d1_0, d1_1 = f32(f32(denoised - den_1) / r0), f32(f32(den_1 - den_2) / r1)
    d1 = f32(d1_0 + f32(f32(d1_0 - d1_1) * r0) / np.float32(r0 + r1))
    d2 = f32(f32(d1_0 - d1_1) / np.float32(r0 + r1))
    phi_3 = np.float32(np.float32(phi_2 / h_eta) - HALF)
    return f32(f32(x + np.float32(alpha_t * phi_2) * d1) - np.float32(alpha_t * phi_3) * d2)


def brownian_pair(first: F32, second: F32, sigma: np.float32, mid: np.float32, sigma_next: np.float32) -> F32:
    """The second noise of a DPM++ SDE step from two standard-normal draws: ComfyUI's Brownian tree
    gives the normalised increment over [mid, sigma] (``first`` itself) and then the one over
    [sigma_next, sigma], which contains it: (sqrt(sigma - mid) first + sqrt(mid - sigma_next)
    second) / sqrt(sigma - sigma_next), in float64 (the tree's joint law; sdkit.schedulers.dpm_sde)."""
    s, m, n = float(sigma), float(mid), float(sigma_next)
    whole = math.sqrt(s - m) * first.astype(np.float64) + math.sqrt(m - n) * second.astype(np.float64)
    return f32(whole / math.sqrt(s - n))


def dpmpp_2s_sde_rf(run: Run) -> Steps:
    """ComfyUI's ``sample_dpmpp_sde`` (eta 1, r 1/2) on a flow model (``CONST``): DPM-Solver++(2S)
    with ancestral noise in the half log-SNR lambda = log((1 - sigma) / sigma), on
    :func:`offset_first_sigma_for_snr`'s sigmas s. Per step, with D the x0 estimate at s[i],
    h = lambda(s[i+1]) - lambda(s[i]), the midpoint lambda_m = lambda(s[i]) + h / 2, sigma_m =
    sigmoid(-lambda_m) (one more model call, its estimate D2), alpha(sigma) = sigma exp(lambda(sigma))
    (= 1 - sigma) and the ancestral split (sd, su) of k-diffusion's ``get_ancestral_step`` between the
    variance-exploding sigmas exp(-lambda):

        to the midpoint: (sd, su) from exp(-lambda(s[i])) to exp(-lambda_m), h' = -log(sd) - lambda(s[i])
            x2 = (alpha_m / alpha_i) exp(-h') x - alpha_m expm1(-h') D + alpha_m z1 su
        to s[i+1]: (sd, su) from exp(-lambda(s[i])) to exp(-lambda(s[i+1])), h' likewise
            x = (alpha' / alpha_i) exp(-h') x - alpha' expm1(-h') D2 + alpha' n2 su

    (ComfyUI's (1 - 1/(2r)) D + 1/(2r) D2 is D2 at r = 1/2.) z1 and n2 are the Brownian tree's
    increments over [sigma_m, s[i]] and [s[i+1], s[i]] in flow sigmas (:func:`brownian_pair`, two
    draws per step; none when s_noise is 0). The step to sigma 0 is x = D (one call)."""
    s, x, s_noise = offset_first_sigma_for_snr(run), run.x, s_noise_of(run)
    for i in range(len(s) - 1):
        ev = yield x, s[i], i
        x, denoised = ev.x, ev.denoised
        if s[i + 1] == 0:
            x = denoised
            continue
        lambda_s, lambda_t = _half_log_snr(s[i], True), _half_log_snr(s[i + 1], True)
        h = np.float32(lambda_t - lambda_s)
        lambda_m = np.float32(lambda_s + HALF * h)
        sigma_m = np.float32(ONE / np.float32(ONE + exp32(lambda_m)))  # sigmoid(-lambda_m)
        alpha_s = np.float32(s[i] * exp32(lambda_s))
        alpha_m = np.float32(sigma_m * exp32(lambda_m))
        alpha_t = np.float32(s[i + 1] * exp32(lambda_t))
        noisy = s_noise > 0
        x2, z1 = _sde_half(x, denoised, lambda_s, lambda_m, alpha_s, alpha_m, None, s_noise, run if noisy else None)
        ev2 = yield x2, sigma_m, i
        second = run.noise() if noisy else None
        n2 = None if z1 is None or second is None else brownian_pair(z1, second, s[i], sigma_m, s[i + 1])
        x, _ = _sde_half(x, ev2.denoised, lambda_s, lambda_t, alpha_s, alpha_t, n2, s_noise, None)
    return x


def _sde_half(
    x: F32,
    denoised: F32,
    lambda_s: np.float32,
    lambda_to: np.float32,
    alpha_s: np.float32,
    alpha_to: np.float32,
    noise: F32 | None,
    s_noise: np.float32,
    run: Run | None,
) -> tuple[F32, F32 | None]:
    """One half of :func:`dpmpp_2s_sde_rf` from lambda_s to lambda_to (ComfyUI's operation order); the
    noise is ``noise``, else a draw of ``run`` (None: no noise). Returns (x, the noise used)."""
    sigma_down, sigma_up = ancestral_step(exp32(-lambda_s), exp32(-lambda_to))
    h_down = np.float32(-log32(sigma_down) - lambda_s)
    decay = np.float32(np.float32(alpha_to / alpha_s) * exp32(-h_down))
    x = f32(decay * x - np.float32(alpha_to * expm1_32(-h_down)) * denoised)
    if noise is None and run is not None:
        noise = run.noise()
    if noise is not None:
        x = f32(x + f32(f32(alpha_to * noise) * s_noise) * sigma_up)
    return x, noise


def dpmpp_2m_sde_rf(run: Run) -> Steps:
    """ComfyUI's ``sample_dpmpp_2m_sde`` on a flow model: :func:`dpmpp_sde_rf` order 2."""
    return (yield from dpmpp_sde_rf(run, 2))


def dpmpp_3m_sde_rf(run: Run) -> Steps:
    """ComfyUI's ``sample_dpmpp_3m_sde`` on a flow model: :func:`dpmpp_sde_rf` order 3."""
    return (yield from dpmpp_sde_rf(run, 3))


# -- A1111 only -------------------------------------------------------------------------------------


def karras_f32(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> F32:
    """k-diffusion's ``get_sigmas_karras`` as torch computes it: a float32 ramp, the ends' 1/rho powers
    in Python floats, the rest in float32; the final 0 appended."""
    ramp = torch_linspace_f32(0.0, 1.0, n)
    min_inv, max_inv = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sigmas = (np.float32(max_inv) + ramp * np.float32(min_inv - max_inv)) ** np.float32(rho)
    return np.append(sigmas, np.float32(0)).astype(np.float32)


def restart_pairs(s: F32) -> list[tuple[np.float32, np.float32]]:
    """The (sigma, next sigma) segments of A1111's ``restart_sampler`` with its automatic restart list.

    Below 20 steps: the schedule's own steps (plain Heun). From 20 (36) steps: the main schedule
    becomes Karras over [s[-2], s[0]] with ``steps - 9`` (``steps - 2 * (steps // 4)``) steps; after
    the step that lands nearest sigma 0.1 the segment from the sigma nearest 2 back down to it is run
    again once (twice), in ``10`` (``steps // 4 + 1``) Karras sigmas; each restart jumps up by adding noise.
    """
    steps = len(s) - 1
    restarts: dict[float, tuple[int, int, float]] = {}
    if steps >= 20:
        restart_steps, times = (steps // 4, 2) if steps >= 36 else (9, 1)
        s = karras_f32(steps - restart_steps * times, float(s[-2]), float(s[0]))
        restarts = {0.1: (restart_steps + 1, times, 2.0)}
    at = {int(np.argmin(np.abs(s - np.float32(key)))): value for key, value in restarts.items()}
    pairs = []
    for i in range(len(s) - 1):
        pairs.append((s[i], s[i + 1]))
        if i + 1 in at:
            count, times, top = at[i + 1]
            low, high = i + 1, int(np.argmin(np.abs(s - np.float32(top))))
            if high < low:
                segment = karras_f32(count, float(s[low]), float(s[high]))[:-1]
                pairs += list(itertools.pairwise(segment)) * times
    return pairs


def restart(run: Run) -> Steps:
    """A1111's ``restart_sampler`` (Xu et al. 2023, "Restart Sampling for Improving Generative
    Processes"): Heun steps (Euler to sigma 0) over :func:`restart_pairs`; where a segment starts
    above the last sigma reached, x += z * s_noise * sqrt(sigma^2 - last^2) first (z ~ N(0, 1))."""
    x, s_noise = run.x, s_noise_of(run)
    last: np.float32 | None = None
    for k, (sigma, sigma_next) in enumerate(restart_pairs(run.sigmas)):
        if last is not None and last < sigma:
            x = f32(x + f32(run.noise() * s_noise) * sqrt32(np.float32(sigma * sigma - last * last)))
        ev = yield x, sigma, k
        x, dt = ev.x, np.float32(sigma_next - sigma)
        d = to_d(x, ev.denoised, sigma)
        if sigma_next == 0:
            x = f32(x + d * dt)
        else:
            ev2 = yield f32(x + d * dt), sigma_next, k
            x = f32(x + f32((d + to_d(ev2.x, ev2.denoised, sigma_next)) / np.float32(2)) * dt)
        last = sigma_next
    return x
