"""A1111's ``s_noise`` and ComfyUI's table schedules (simple, ddim_uniform, beta) against
k-diffusion and ComfyUI's algorithm.

Oracles:
- k-diffusion 0.1.1.post1 (the sampler code A1111 runs): ``fixtures/schedulers/make_golden.py``
  ran ``sample_euler_ancestral``, ``sample_dpmpp_2m_sde`` and ``sample_dpmpp_sde`` with
  ``s_noise`` on sigma lists (diffusers' schedules, or diffusers' training-sigma table at the
  indices ComfyUI's code picks), recording every model call (sample, sigma, denoised) and the
  noise. Each call is replayed teacher-forced: sdkit's step from the recorded sample, with the
  epsilon that gives the recorded denoised, must land on the next recorded sample.
- ComfyUI's ``simple_scheduler`` / ``ddim_scheduler`` / ``beta_scheduler`` (transcribed into the
  golden script, beta via scipy as ComfyUI does) for the picked timesteps, plus worked examples
  checked by hand from ComfyUI's source.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scheduler_goldens import GOLDEN, Replay, max_scaled_error

from sdkit.errors import OptionError
from sdkit.schedulers import create_scheduler
from sdkit.schedulers.table_schedules import (
    beta_ppf,
    beta_timesteps,
    ddim_uniform_timesteps,
    regularized_incomplete_beta,
    simple_timesteps,
)

TOL = 1e-6  # |ours - k-diffusion| <= TOL * max(1, |k-diffusion|)
# Measured worst cases above TOL, with their cause: k-diffusion's DPM++ 2M SDE works on x (VE),
# sdkit's (as diffusers') on x / sqrt(sigma^2 + 1) (VP); converting the recorded samples into VP and
# the results back costs 1-2 float32 ulps of values up to ~15 (sigma_max), i.e. up to ~2.3e-6.
KDIFF_TOLERANCE: dict[str, float] = {
    "kdiff/dpmpp_2m_sde-karras-6-s_noise1.0": 5e-6,  # measured 1.19e-6
    "kdiff/dpmpp_2m_sde-karras-6-s_noise0.6": 5e-6,  # measured 1.07e-6
    "kdiff/dpmpp_2m_sde-beta-6-s_noise1.2": 5e-6,  # measured 2.26e-6
}


@pytest.mark.parametrize("spec", GOLDEN.cases("kdiffusion_cases"), ids=lambda c: c["key"])
def test_kdiffusion_replay(spec: dict[str, Any]) -> None:
    rec = GOLDEN.case(spec["key"])
    sched = create_scheduler(spec["sampler"], schedule=spec["schedule"], s_noise=spec["s_noise"])
    sched.set_timesteps(spec["steps"])
    k_sigmas = rec["sigmas"]
    # the sigma list k-diffusion ran is sdkit's (the step sigmas; SDE midpoints are internal)
    ours = sched.sigmas if spec["sampler"] != "dpmpp_sde" else np.concatenate([sched.sigmas[:1], sched.sigmas[1::2]])
    assert max_scaled_error(ours, k_sigmas) <= TOL
    vp = spec["sampler"] == "dpmpp_2m_sde"  # sdkit's DPM-Solver works on x / sqrt(sigma^2 + 1)
    xs = [*rec["x"], rec["final"]]
    sigmas = [*rec["sigma"], np.float32(0.0)]
    tape = Replay(rec["noise"])
    worst = 0.0
    for i, t in enumerate(sched.timesteps):
        x, sigma, denoised = rec["x"][i], rec["sigma"][i], rec["denoised"][i]
        eps = ((x - denoised) / sigma).astype(np.float32)
        scale = np.float32(1.0) / np.sqrt(sigma * sigma + np.float32(1.0)) if vp else np.float32(1.0)
        sched.scale_model_input(x * scale, t)
        out = sched.step(eps, t, (x * scale).astype(np.float32), noise=tape)
        nxt = sigmas[i + 1]
        expected = xs[i + 1] / np.sqrt(nxt * nxt + np.float32(1.0)) if vp else xs[i + 1]
        worst = max(worst, max_scaled_error(out, expected))
    assert tape.used == len(rec["noise"])
    assert worst <= KDIFF_TOLERANCE.get(spec["key"], TOL), f"scaled error {worst:.3g}"


def test_s_noise_changes_the_noise_term_only() -> None:
    """s_noise = 0 removes the ancestral noise; s_noise = 1 is the default."""
    x = np.ones((1, 4, 2, 2), np.float32)
    out = {}
    for s_noise in (0.0, 1.0, None):
        sched = create_scheduler("euler_a", **({} if s_noise is None else {"s_noise": s_noise}))
        sched.set_timesteps(4)
        out[s_noise] = sched.step(0.5 * x, sched.timesteps[0], x, noise=lambda shape: np.ones(shape, np.float32))
    assert np.array_equal(out[1.0], out[None])
    assert not np.array_equal(out[0.0], out[1.0])


def test_option_errors() -> None:
    with pytest.raises(OptionError, match="no option 'eta'"):
        create_scheduler("euler", eta=0.5)
    with pytest.raises(OptionError, match="no option 's_noise'"):
        create_scheduler("ddim", s_noise=1.1)
    with pytest.raises(OptionError, match=r"eta must be a number in \[0.0, 1.0\]"):
        create_scheduler("ddim", eta=1.5)
    with pytest.raises(OptionError, match="s_noise"):
        create_scheduler("euler_a", s_noise="x")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="schedule 'beta'"):  # ddim / lcm take it (ComfyUI's, on sigmas)
        create_scheduler("tcd", schedule="beta")


def test_ddim_draws_noise_only_with_eta() -> None:
    assert create_scheduler("ddim").draws_noise is False
    assert create_scheduler("ddim", eta=0.3).draws_noise is True
    sched = create_scheduler("ddim", eta=0.3)
    sched.set_timesteps(3)
    x = np.zeros((1, 4, 2, 2), np.float32)
    with pytest.raises(Exception, match="noise=callable"):
        sched.step(x, sched.timesteps[0], x)


# -- ComfyUI's table schedules ------------------------------------------------------------------

# Worked by hand from ComfyUI's comfy/samplers.py (N = 1000 training timesteps):
# simple: t = 999 - int(x * 1000 / steps); ddim_uniform: range(1, 1000, 1000 // steps) reversed;
# beta: rint(BetaPPF(1 - x / steps; 0.6, 0.6) * 999), repeats dropped.
HAND_CHECKED = {
    ("simple", 3): [999, 666, 333],
    ("simple", 4): [999, 749, 499, 249],
    ("ddim_uniform", 4): [751, 501, 251, 1],
    ("ddim_uniform", 3): [667, 334, 1],
    ("ddim_uniform", 7): [995, 853, 711, 569, 427, 285, 143, 1],  # eight steps for seven
    ("beta", 4): [999, 823, 500, 176],
    ("beta", 1): [999],
}


@pytest.mark.parametrize(("schedule", "steps"), sorted(HAND_CHECKED))
def test_table_schedule_worked_examples(schedule: str, steps: int) -> None:
    picked = {"simple": simple_timesteps, "ddim_uniform": ddim_uniform_timesteps, "beta": beta_timesteps}[schedule]
    assert picked(1000, steps) == HAND_CHECKED[(schedule, steps)]


def _tables() -> list[str]:
    if not GOLDEN.is_file():
        return []
    return sorted(k for k in GOLDEN.arrays if k.startswith("tables/") and k != "tables/train_sigmas_sd15")


@pytest.mark.parametrize("key", _tables())
def test_table_schedules_match_comfyui_transcription(key: str) -> None:
    """sdkit's picks equal ComfyUI's algorithm run in the golden script (scipy's Beta quantiles)."""
    schedule, steps = key.removeprefix("tables/").rsplit("-", 1)
    expected = GOLDEN.arrays[key].tolist()
    picked = {"simple": simple_timesteps, "ddim_uniform": ddim_uniform_timesteps, "beta": beta_timesteps}[schedule]
    assert picked(1000, int(steps)) == expected
    sched = create_scheduler("euler", schedule=schedule)
    sched.set_timesteps(int(steps))
    assert sched.timesteps.tolist() == expected
    table = GOLDEN.arrays["tables/train_sigmas_sd15"]
    assert max_scaled_error(sched.sigmas, np.append(table[expected], 0.0)) <= TOL


def test_table_schedules_in_every_sigma_sampler() -> None:
    for name in ("euler", "euler_a", "heun", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde"):
        sched = create_scheduler(name, schedule="simple")
        sched.set_timesteps(4)
        assert float(sched.sigmas[-1]) == 0.0
        assert 999 in np.asarray(sched.timesteps).round().astype(int).tolist()


def test_beta_ppf_against_known_values() -> None:
    """Closed forms: Beta(1, 1) is uniform, Beta(2, 1) has CDF x^2, Beta(1, 2) 1 - (1 - x)^2;
    Beta(0.5, 0.5) is the arcsine law, CDF (2/pi) asin(sqrt(x))."""
    for q in (0.01, 0.2, 0.5, 0.77, 0.999):
        assert beta_ppf(q, 1.0, 1.0) == pytest.approx(q, abs=1e-14)
        assert beta_ppf(q, 2.0, 1.0) == pytest.approx(q**0.5, abs=1e-14)
        assert beta_ppf(q, 1.0, 2.0) == pytest.approx(1 - (1 - q) ** 0.5, abs=1e-14)
        assert beta_ppf(q, 0.5, 0.5) == pytest.approx(np.sin(np.pi * q / 2) ** 2, abs=1e-13)
    assert regularized_incomplete_beta(0.3, 0.6, 0.6) + regularized_incomplete_beta(0.7, 0.6, 0.6) == pytest.approx(1)
    # scipy.stats.beta.ppf(0.75, 0.6, 0.6) (scipy 1.17.1), the value ComfyUI's beta schedule uses
    assert beta_ppf(0.75, 0.6, 0.6) == pytest.approx(0.82431962, abs=5e-9)
