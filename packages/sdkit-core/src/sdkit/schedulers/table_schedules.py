"""ComfyUI's ``simple``, ``ddim_uniform`` and ``beta`` schedules: sigmas picked from the training table.

These three do not compute sigmas; they pick entries of the model's table of training sigmas
``table[t] = sqrt((1 - alphas_cumprod[t]) / alphas_cumprod[t])``, ``t = 0 .. N-1`` (N =
``num_train_timesteps``, 1000 for Stable Diffusion), and append a final 0. The model is then
called at the integer timestep ``t`` of each picked sigma. The algorithms, as ComfyUI's
``comfy/samplers.py`` has them (``simple_scheduler``, ``ddim_scheduler``, ``beta_scheduler``):

simple
    ``ss = N / steps`` (a float); for ``x = 0 .. steps-1`` take ``t = N - 1 - int(x * ss)``.
    Worked example, N = 1000, steps = 3: ss = 333.33..., t = 999, 999 - 333 = 666,
    999 - 666 = 333; sigmas ``table[999], table[666], table[333], 0``.

ddim_uniform
    ``ss = max(N // steps, 1)`` (integer division); take ``t = 1, 1 + ss, 1 + 2 ss, ...`` while
    ``t < N``, in reverse. Worked example, N = 1000, steps = 4: ss = 250, t = 751, 501, 251, 1;
    steps = 7: ss = 142, t = 995, 853, ..., 143, 1: **eight** sampling steps for seven asked
    (ComfyUI does the same). ComfyUI starts without the final 0 when ``table[1]`` is ~0 (a
    zero-terminal-SNR table); sdkit refuses such tables elsewhere, so that branch is an error here.

beta (Lee et al. 2024, "Beta Sampling is All You Need", alpha = beta = 0.6 as ComfyUI)
    ``q_x = 1 - x / steps`` for ``x = 0 .. steps-1``; ``t = rint(BetaPPF(q_x; alpha, beta) * (N - 1))``
    (numpy's rint: halves go to the even neighbour); consecutive repeats of ``t`` are dropped,
    so fewer steps than asked can remain. Worked example, N = 1000, steps = 4: q = 1, 0.75, 0.5,
    0.25; BetaPPF(1) = 1 -> t = 999; BetaPPF(0.75) = 0.824320 -> 823.495 -> 823; BetaPPF(0.5)
    = 0.5 -> 499.5 -> 500 (to even); BetaPPF(0.25) = 0.175680 (symmetry) -> 175.505 -> 176:
    t = 999, 823, 500, 176.
    The Beta quantile function is computed here (``beta_ppf``: the regularised incomplete beta
    function by its continued fraction, inverted by bisection to double precision) so scipy is not
    needed at run time. diffusers' ``use_beta_sigmas`` implements the same paper differently (it
    spaces sigmas, not timesteps, between sigma_min and sigma_max), so it is not ComfyUI's "beta".

The sigma values are sdkit's (diffusers') float32 training table; ComfyUI builds its table with
other float32 roundings, so individual sigmas may differ from ComfyUI's in the last bits.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import OptionError

TABLE_SCHEDULES = ("simple", "ddim_uniform", "beta")
BETA_ALPHA = 0.6
BETA_BETA = 0.6


def simple_timesteps(num_train_timesteps: int, steps: int) -> list[int]:
    """ComfyUI's ``simple`` schedule as training timesteps, descending."""
    stride = num_train_timesteps / steps
    return [num_train_timesteps - 1 - int(x * stride) for x in range(steps)]


def ddim_uniform_timesteps(num_train_timesteps: int, steps: int) -> list[int]:
    """ComfyUI's ``ddim_uniform`` schedule as training timesteps, descending (may be longer than steps)."""
    stride = max(num_train_timesteps // steps, 1)
    return list(range(1, num_train_timesteps, stride))[::-1]


def beta_timesteps(
    num_train_timesteps: int, steps: int, alpha: float = BETA_ALPHA, beta: float = BETA_BETA
) -> list[int]:
    """ComfyUI's ``beta`` schedule as training timesteps, descending, repeats dropped."""
    quantiles = 1.0 - np.linspace(0.0, 1.0, steps, endpoint=False)
    picked = np.rint(np.array([beta_ppf(float(q), alpha, beta) for q in quantiles]) * (num_train_timesteps - 1))
    out: list[int] = []
    for t in picked:
        if not out or int(t) != out[-1]:
            out.append(int(t))
    return out


def table_schedule(
    name: str, steps: int, train_sigmas: NDArray[np.float32]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(timesteps, sigmas without the final 0), float64, for a table schedule."""
    total = len(train_sigmas)
    if name == "simple":
        picked = simple_timesteps(total, steps)
    elif name == "ddim_uniform":
        if float(train_sigmas[1]) <= 1e-5:
            raise OptionError("schedule 'ddim_uniform' needs a training table whose sigma at t=1 is above 0")
        picked = ddim_uniform_timesteps(total, steps)
    elif name == "beta":
        picked = beta_timesteps(total, steps)
    else:
        raise OptionError(f"{name!r} is not a table schedule; use one of {', '.join(TABLE_SCHEDULES)}")
    timesteps = np.asarray(picked, dtype=np.float64)
    return timesteps, train_sigmas[np.asarray(picked)].astype(np.float64)


def _incomplete_beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz), valid for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 400):
        # even term m(b - m)x / ((a + 2m - 1)(a + 2m)), then odd -(a + m)(a + b + m)x / ((a + 2m)(a + 2m + 1))
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return result


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the Beta(a, b) distribution function at x."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _incomplete_beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(1.0 - x, b, a) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """The Beta(a, b) quantile function (inverse of ``regularized_incomplete_beta``), by bisection."""
    if not 0.0 <= q <= 1.0:
        raise OptionError(f"a quantile must be in [0, 1], got {q}")
    if q in (0.0, 1.0):
        return q
    if a == b and q == 0.5:
        return 0.5  # exact by symmetry; bisection could land one ulp off and flip a rounding
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if regularized_incomplete_beta(mid, a, b) < q:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)
