"""uni_pc, uni_pc_bh2, deis, tcd, ipndm and the flow variants against diffusers (golden_multistep.npz).

Each case replays a diffusers run of fixtures/schedulers/make_golden_multistep.py teacher-forced:
same config, schedule, prediction type and options, the recorded sample and model output fed
into every step, the recorded noise injected, every output compared within TOL (1e-6, relative
above 1). Where sdkit steps to sigma 0 and diffusers cannot (UniPC bh1: NaN; DEIS: stops at
sigma_min) or does not return the clean estimate there (iPNDM), that last step is checked against
the clean estimate computed from the recorded model output instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scheduler_goldens import GOLDEN_MULTISTEP as GOLDEN
from scheduler_goldens import Replay, max_scaled_error

from sdkit.schedulers import create_scheduler

TOL = 1e-6
FLUX_TOKENS = {"flux_dev": True, "flux_schnell": False, "sd3": False}

pytestmark = pytest.mark.skipif(not GOLDEN.is_file(), reason=f"{GOLDEN} not found")


def _clean_vp(sched: Any, sigma: float, model_out: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """The clean estimate of a discrete model at k-diffusion ``sigma`` (float64 formula)."""
    alpha = 1 / np.sqrt(sigma * sigma + 1)
    out, x = model_out.astype(np.float64), sample.astype(np.float64)
    if sched.prediction_type == "epsilon":
        return (x - sigma * alpha * out) / alpha
    return alpha * x - sigma * alpha * out


@pytest.mark.parametrize("spec", GOLDEN.cases("cases"), ids=lambda c: c["key"])
def test_matches_diffusers(spec: dict[str, Any]) -> None:
    rec = GOLDEN.case(spec["key"])
    config = dict(GOLDEN.meta["configs"][spec["config"]])
    sched = create_scheduler(
        spec["sampler"], schedule=spec["schedule"], config=config, prediction_type=spec["prediction"], **spec["options"]
    )
    sched.set_timesteps(spec["steps"], strength=spec["strength"])
    assert sched.timesteps.dtype == rec["timesteps"].dtype
    assert max_scaled_error(sched.timesteps, rec["timesteps"]) <= TOL
    to_zero = spec["sampler"] in ("uni_pc", "deis")  # diffusers cannot step to sigma 0 (see the docstring)
    if "all_sigmas" in rec:
        tail = len(rec["all_sigmas"]) - len(sched.sigmas)
        assert max_scaled_error(sched.sigmas[:-1], rec["all_sigmas"][tail:-1]) <= TOL
        assert sched.sigmas[-1] == 0
    if spec["strength"] < 1.0:
        start = sched.add_noise(rec["clean"], rec["init_noise"], sched.timesteps[0])
    else:
        start = rec["init_noise"] * np.float32(sched.init_noise_sigma)
    assert max_scaled_error(start, rec["start"]) <= TOL
    noise, latents = Replay(rec["noise"]), rec["start"]
    for i, t in enumerate(sched.timesteps):
        assert max_scaled_error(sched.scale_model_input(latents, t), rec["model_in"][i]) <= TOL
        sigma = float(sched.sigmas[i])
        out = sched.step(rec["model_out"][i], t, latents, noise=noise)
        assert out.dtype == np.float32
        if to_zero and i == len(sched.timesteps) - 1:
            clean = _clean_vp(sched, sigma, rec["model_out"][i], latents)
            assert max_scaled_error(out, clean) <= 1e-5, "the step to sigma 0 returns the clean estimate"
        else:
            err = max_scaled_error(out, rec["prev"][i])
            assert err <= TOL, f"step {i} (t={t}): scaled error {err:.3g}"
        latents = rec["prev"][i]
    assert noise.used == len(rec["noise"])


@pytest.mark.parametrize("spec", GOLDEN.cases("ipndm_cases"), ids=lambda c: c["key"])
def test_ipndm_matches_diffusers_ipndm(spec: dict[str, Any]) -> None:
    """sdkit's ipndm (k-diffusion coordinates) against diffusers' IPNDMScheduler fed the same sigmas
    (variance-preserving coordinates: x_ve = x_vp / alpha)."""
    rec = GOLDEN.case(spec["key"])
    sched = create_scheduler("ipndm", schedule=spec["schedule"], config=dict(GOLDEN.meta["configs"][spec["config"]]))
    sched.set_timesteps(spec["steps"])
    assert max_scaled_error(sched.sigmas, rec["sigmas"]) <= TOL
    alphas = rec["alphas"]
    n = len(sched.timesteps)
    for i, t in enumerate(sched.timesteps):
        latents = rec["x_vp"][i] / alphas[i]
        assert max_scaled_error(sched.scale_model_input(latents, t), rec["x_vp"][i]) <= TOL
        out = sched.step(rec["eps"][i], t, latents)
        if i < n - 1:
            err = max_scaled_error(out, rec["prev_vp"][i] / alphas[i + 1])
            assert err <= TOL, f"step {i}: scaled error {err:.3g}"
        else:  # ComfyUI's last step: the clean estimate x - sigma * eps
            clean = latents.astype(np.float64) - float(rec["sigmas"][i]) * rec["eps"][i].astype(np.float64)
            assert max_scaled_error(out, clean) <= 1e-5


@pytest.mark.parametrize("spec", GOLDEN.cases("flow_cases"), ids=lambda c: c["key"])
def test_flow_variant_matches_diffusers(spec: dict[str, Any]) -> None:
    rec = GOLDEN.case(spec["key"])
    config = dict(GOLDEN.meta["flow_configs"][spec["config"]])
    sched = create_scheduler(spec["sampler"], config=config)
    assert sched.prediction_type == "flow" and sched.name == spec["sampler"] + "_flow"
    steps = spec["steps"]
    kwargs: dict[str, Any] = {}
    if spec["image_seq_len"] is not None:
        kwargs["mu"] = sched.mu_for(spec["image_seq_len"])
    if spec["sigmas"] == "linear":
        kwargs["sigmas"] = np.linspace(1.0, 1 / steps, steps)
    sched.set_timesteps(steps, spec["strength"], **kwargs)
    tail = len(rec["all_sigmas"]) - len(sched.sigmas)
    assert max_scaled_error(sched.sigmas, rec["all_sigmas"][tail:]) <= TOL
    start = (
        rec["init_noise"]
        if spec["strength"] >= 1
        else sched.add_noise(rec["clean"], rec["init_noise"], sched.timesteps[0])
    )
    assert max_scaled_error(start, rec["start"]) <= TOL
    latents = rec["start"]
    n = len(sched.timesteps)
    for i, t in enumerate(sched.timesteps):
        out = sched.step(rec["model_out"][i], t, latents)
        if i == n - 1:  # to sigma 0: the clean estimate x - sigma * v (diffusers' bh1 / DEIS give NaN there)
            sigma = float(sched.sigmas[i])
            clean = latents.astype(np.float64) - sigma * rec["model_out"][i].astype(np.float64)
            assert max_scaled_error(out, clean) <= 1e-5
            if spec["sampler"] == "uni_pc_bh2":
                assert max_scaled_error(out, rec["prev"][i]) <= TOL
        else:
            err = max_scaled_error(out, rec["prev"][i])
            assert err <= TOL, f"step {i}: scaled error {err:.3g}"
        latents = rec["prev"][i]
