"""Align Your Steps, KL Optimal and Linear-Quadratic: sigma schedules computed from a formula or a table.

None of the three is in diffusers; each is written down here from the tools that have it (no
code copied), with a worked example that ``tests/schedulers/test_sigma_schedules.py`` checks.
Each returns the ``steps`` sigmas of the sampling steps; the sampler appends the final 0 and
takes the model's (fractional) timestep of each sigma from the training table, as it does for
Karras. ``sigma_min`` / ``sigma_max`` are the ends of the model's training table (SD 1.x:
0.0292 and 14.6146), what ComfyUI's ``model_sampling`` and A1111's ``inner_model`` report.

align_your_steps (A1111 1.9+ "Align Your Steps"; Sabour et al. 2024)
    NVIDIA's published 11-point tables (https://research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html):
    ``AYS_TABLES["sd15" | "sdxl" | "svd"]``, each from sigma_max down to sigma_min. For ``steps``
    other than 11, the table is interpolated log-linearly: with ``x_j = j / 10`` (j = 0..10) and
    ``y_j = log(table reversed)``, the new sigmas are ``exp(interp(linspace(0, 1, steps), x, y))``
    reversed (numpy ``interp``, float64). Then a 0 is appended. This is A1111's construction
    (``modules/sd_schedulers.py``); ComfyUI's AlignYourStepsScheduler node instead interpolates
    ``steps + 1`` points of its longer-decimal tables and replaces the last one by 0, so its
    schedule differs (it never samples at 0.029). Worked example, SD 1.5, steps = 6: x_new =
    0, 0.2, ..., 1 lands on table points 0, 2, 4, 6, 8, 10 (positions 2 j in the reversed table),
    so the sigmas are 14.615, 3.861, 1.886, 0.963, 0.399, 0.029 exactly; steps = 5 lands on
    positions 0, 2.5, 5, 7.5, 10, so the second sigma is halfway in log between 3.861 and 2.697,
    sqrt(3.861 * 2.697) = 3.2269362, and the fourth sqrt(0.652 * 0.399) = 0.5100471
    The tables are the SD 1.x / SDXL / SVD models' own: ``align_your_steps`` takes SD 1.5's,
    ``align_your_steps_sdxl`` SDXL's (the SDXL pipeline picks it for "Align Your Steps", as A1111
    does), ``align_your_steps_svd`` SVD's.

kl_optimal (ComfyUI's ``kl_optimal``, A1111's "KL Optimal"; Sabour et al. 2024, eq. 9)
    Evenly spaced in ``atan(sigma)``: for ``i = 0 .. steps-1``, ``w = i / (steps - 1)``,
    ``sigma_i = tan(w * atan(sigma_min) + (1 - w) * atan(sigma_max))``, then 0 (ComfyUI's form;
    A1111's takes ``steps + 1`` such points ending at sigma_min without a final 0). One step is
    ``[sigma_max]``. Worked example, sigma_min = 0.1, sigma_max = 10, steps = 3: atan = 1.4711277,
    0.0996687; middle atan 0.7853982 = pi/4, so the sigmas are 10, 1, 0.1 (tan(pi/4) = 1).

linear_quadratic (ComfyUI's ``linear_quadratic``, from Genmo's Mochi)
    With ``threshold = 0.025`` and ``L = steps // 2`` linear steps, the noise fractions
    ``f_i = i * threshold / L`` for ``i < L``; then for ``i = L .. steps-1`` the quadratic
    ``a i^2 + b i + c`` with ``d = L - threshold * steps``, ``a = d / (L * Q^2)`` (``Q = steps - L``),
    ``b = threshold / L - 2 d / Q^2``, ``c = a L^2``; then 1. The sigmas are ``(1 - f) * sigma_max``
    (the last, ``1 - 1 = 0``, is the final 0). One step is ``[sigma_max]``. Worked example,
    steps = 4: L = Q = 2, f = 0, 0.0125; d = 1.9, a = 0.2375, b = -0.9375, c = 0.95, so f(2) =
    0.025, f(3) = 0.275: sigmas = (1, 0.9875, 0.975, 0.725) * sigma_max, then 0.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import OptionError

F64 = NDArray[np.float64]

# NVIDIA's published Align Your Steps tables (10 steps, 11 sigmas each).
AYS_TABLES: dict[str, tuple[float, ...]] = {
    "sd15": (14.615, 6.475, 3.861, 2.697, 1.886, 1.396, 0.963, 0.652, 0.399, 0.152, 0.029),
    "sdxl": (14.615, 6.315, 3.771, 2.181, 1.342, 0.862, 0.555, 0.380, 0.234, 0.113, 0.029),
    "svd": (700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002),
}
AYS_SCHEDULES = {"align_your_steps": "sd15", "align_your_steps_sdxl": "sdxl", "align_your_steps_svd": "svd"}
COMPUTED_SCHEDULES = (*AYS_SCHEDULES, "kl_optimal", "linear_quadratic")
LINEAR_QUADRATIC_THRESHOLD = 0.025


def loglinear_interp(table: tuple[float, ...] | F64, num: int) -> F64:
    """A decreasing table resampled to ``num`` points, linearly in log sigma (float64)."""
    ys = np.log(np.asarray(table, dtype=np.float64)[::-1])
    xs = np.linspace(0.0, 1.0, len(ys))
    return np.asarray(np.exp(np.interp(np.linspace(0.0, 1.0, num), xs, ys))[::-1], dtype=np.float64)


def ays_sigmas(table: str, steps: int) -> F64:
    """A1111's Align Your Steps sigmas for ``steps`` steps (without the final 0)."""
    values = AYS_TABLES[table]
    if steps == len(values):
        return np.asarray(values, dtype=np.float64)
    return loglinear_interp(values, steps)


def kl_optimal_sigmas(sigma_min: float, sigma_max: float, steps: int) -> F64:
    """Sigmas evenly spaced in atan(sigma) from sigma_max to sigma_min (without the final 0)."""
    if steps == 1:
        return np.array([sigma_max], dtype=np.float64)
    w = np.arange(steps, dtype=np.float64) / (steps - 1)
    return np.asarray(np.tan(w * math.atan(sigma_min) + (1 - w) * math.atan(sigma_max)), dtype=np.float64)


def linear_quadratic_sigmas(sigma_max: float, steps: int, threshold: float = LINEAR_QUADRATIC_THRESHOLD) -> F64:
    """Mochi's linear-then-quadratic schedule scaled to ``sigma_max`` (without the final 0)."""
    if steps == 1:
        return np.array([sigma_max], dtype=np.float64)
    linear_steps = steps // 2
    quadratic_steps = steps - linear_steps
    fractions = [i * threshold / linear_steps for i in range(linear_steps)]
    diff = linear_steps - threshold * steps
    a = diff / (linear_steps * quadratic_steps**2)
    b = threshold / linear_steps - 2 * diff / quadratic_steps**2
    c = a * linear_steps**2
    fractions += [a * i * i + b * i + c for i in range(linear_steps, steps)]
    return np.asarray([(1.0 - f) * sigma_max for f in fractions], dtype=np.float64)


def computed_sigmas(name: str, steps: int, sigma_min: float, sigma_max: float) -> F64:
    """The ``steps`` sigmas of schedule ``name`` for a model whose sigmas span [sigma_min, sigma_max]."""
    if name in AYS_SCHEDULES:
        return ays_sigmas(AYS_SCHEDULES[name], steps)
    if name == "kl_optimal":
        return kl_optimal_sigmas(sigma_min, sigma_max, steps)
    if name == "linear_quadratic":
        return linear_quadratic_sigmas(sigma_max, steps)
    raise OptionError(f"{name!r} is not a computed schedule; use one of {', '.join(COMPUTED_SCHEDULES)}")
