"""DPM2, DPM2 a, DPM++ 2S a, DPM++ 3M SDE, LMS, DDPM, Heun++ 2, Euler CFG++, DPM++ 2M CFG++ and the
flow-model samplers (DPM++ SDE, DDIM and LCM among them; sdkit.schedulers.k_solvers) against their references.

Oracles (fixtures/schedulers/make_golden.py, ``ksolvers/`` and ``ksolvers_diffusers/``):
- k-diffusion 0.1.1.post1's ``sample_dpm_2``, ``sample_dpm_2_ancestral``, ``sample_dpmpp_2s_ancestral``,
  ``sample_dpmpp_3m_sde``, ``sample_lms``, ``sample_heun``, ``sample_dpmpp_2m`` (the last three are
  also ComfyUI's code on flow sigmas), run on SD 1.5's or a flow model's sigmas with a fake denoiser;
  every model call and noise draw recorded and replayed teacher-forced: sdkit's step from the
  recorded sample and x0 estimate must give the sample of the reference's next model call;
- ComfyUI-only algorithms (heunpp2, ddpm, the CFG++ samplers, the rectified-flow ancestral
  samplers, LMS's last step on flow models): the torch versions in the golden script, plus a
  hand-worked example each below;
- diffusers' KDPM2DiscreteScheduler, KDPM2AncestralDiscreteScheduler, LMSDiscreteScheduler and
  DDPMScheduler, replayed step by step (model input, output, next sample, injected noise).
Tolerance: TOL (1e-6, relative above 1) unless listed with its cause.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from scheduler_goldens import FIXTURES, GOLDEN, Replay, max_scaled_error

from sdkit.errors import InputError, OptionError
from sdkit.schedulers import create_scheduler, resolve, sampler_label, scheduler_class
from sdkit.schedulers.k_algorithms import lms_coefficient
from sdkit.schedulers.ui_algorithms import restart_pairs

TOL = 1e-6
# Measured worst cases above TOL, with their cause.
# torch's CPU sqrt / pow(0.5) of a 0-d float32 tensor is not always correctly rounded (1 ulp off in 2
# of the 5 sigma_down of the DPM2 a case, in 2 of 7 noise scales of the 3M SDE case: measured);
# numpy's is, and the step amplifies that ulp (ancestral: sigma_down = sqrt(s'^2 - up^2) cancels).
# diffusers' DDPMScheduler goes through x0 and its posterior coefficients, sdkit's (ComfyUI's) ddpm
# through eps and sqrt(1 / alpha): the same formula, other float32 roundings.
TOLERANCE: dict[str, float] = {
    "ksolvers/dpm_2_a-normal-6-s_noise1.0": 5e-6,  # measured 1.11e-6
    "ksolvers/dpmpp_3m_sde-karras-8-s_noise1.0": 5e-6,  # measured 1.91e-6
    "ksolvers_diffusers/dpm_2_a-KDPM2AncestralDiscreteScheduler-6-epsilon": 5e-6,  # measured 1.51e-6
    "ksolvers_diffusers/ddpm-DDPMScheduler-6-epsilon": 5e-6,  # measured 1.93e-6
    "ksolvers_diffusers/ddpm-DDPMScheduler-5-v_prediction": 5e-6,  # measured 1.77e-6
}


pytestmark = pytest.mark.skipif(not GOLDEN.is_file(), reason=f"{GOLDEN} not found")


def _scheduler(spec: dict[str, Any]) -> Any:
    options = {"s_noise": spec["s_noise"]} if "s_noise" in scheduler_class(spec["sampler"]).option_defaults else {}
    if "flow_config" not in spec:
        sched = create_scheduler(spec["sampler"], schedule=spec["schedule"], **options)
        sched.set_timesteps(spec["steps"])
        return sched
    config = GOLDEN.meta["flow_configs"][spec["flow_config"]]
    sched = create_scheduler(spec["sampler"], schedule=spec["schedule"], config=config, **options)
    steps = spec["steps"]
    if sched.uses_dynamic_shifting:
        linear = np.linspace(1.0, 1 / steps, steps) if spec["flow_linear_sigmas"] else None
        sched.set_timesteps(steps, sigmas=linear, mu=sched.mu_for(spec["flow_seq_len"]))
    else:
        sched.set_timesteps(steps)
    return sched


@pytest.mark.parametrize("spec", GOLDEN.cases("ksolver_cases"), ids=lambda c: c["key"])
def test_replays_reference(spec: dict[str, Any]) -> None:
    rec = GOLDEN.case(spec["key"])
    sched = _scheduler(spec)
    flow = "flow_config" in spec
    assert sched.prediction_type == ("flow" if flow else "epsilon")
    assert max_scaled_error(sched.sigmas[:-1], rec["sigma"]) <= TOL  # every model call's sigma
    assert len(sched.timesteps) == len(rec["x"])
    xs = [*rec["x"], rec["final"]]
    tape = Replay(rec["noise"])
    worst = 0.0
    for i, t in enumerate(sched.timesteps):
        x, sigma = rec["x"][i], rec["sigma"][i]
        prediction = ((x - rec["denoised"][i]) / sigma).astype(np.float32)  # eps, or a flow velocity
        uncond = ((x - rec["uncond"][i]) / sigma).astype(np.float32)
        sched.scale_model_input(x, t)
        out = sched.step(prediction, t, x, noise=tape, uncond=uncond if sched.needs_uncond else None)
        worst = max(worst, max_scaled_error(out, xs[i + 1]))
    assert tape.used == len(rec["noise"])
    assert worst <= TOLERANCE.get(spec["key"], TOL), f"scaled error {worst:.3g}"


@pytest.mark.parametrize("spec", GOLDEN.cases("ksolver_diffusers_cases"), ids=lambda c: c["key"])
def test_replays_diffusers(spec: dict[str, Any]) -> None:
    """diffusers' scheduler step by step. DDPMScheduler works on the variance-preserving sample
    x / sqrt(sigma^2 + 1) (sdkit's ddpm, as ComfyUI's, on x): converted both ways; it also draws
    one more noise on its last step (multiplied by a zero variance)."""
    rec = GOLDEN.case(spec["key"])
    sched = create_scheduler(spec["sampler"], config=spec["config"], prediction_type=spec["prediction"])
    sched.set_timesteps(spec["steps"])
    assert max_scaled_error(sched.timesteps, rec["timesteps"]) <= 1e-4  # diffusers' float32 / int64 copies
    vp = spec["sampler"] == "ddpm"
    sigmas = sched.sigmas
    tape = Replay(rec["noise"])
    latents = rec["start"]
    for i, t in enumerate(sched.timesteps):
        scale = np.sqrt(sigmas[i] * sigmas[i] + np.float32(1)) if vp else np.float32(1)
        x = (latents * scale).astype(np.float32)
        assert max_scaled_error(sched.scale_model_input(x, t), rec["model_in"][i]) <= TOL
        out = sched.step(rec["model_out"][i], t, x, noise=tape)
        next_scale = np.sqrt(sigmas[i + 1] * sigmas[i + 1] + np.float32(1)) if vp else np.float32(1)
        err = max_scaled_error(out / next_scale, rec["prev"][i])
        assert err <= TOLERANCE.get(spec["key"], TOL), f"step {i}: scaled error {err:.3g}"
        latents = rec["prev"][i]
    assert tape.used == len(rec["noise"]) - (1 if vp else 0)


# -- hand-worked examples of the ComfyUI-only algorithms ------------------------------------------------
# One-element samples on the sigmas [2, 1, 0.5, 0] with a model whose x0 estimate is a fixed number
# per call, checked against arithmetic done here in Python floats from the formulas of
# sdkit.schedulers.k_algorithms (ComfyUI's comfy/k_diffusion/sampling.py).


def _drive(name: str, sigmas: list[float], x0: float, estimates: list[float]) -> tuple[Any, list[float]]:
    """Run ``name`` (epsilon model) on a hand-made sigma list with the x0 estimate of each model
    call given; the sample after every call."""
    sched = create_scheduler(name)
    sched.set_timesteps(len(sigmas) - 1)
    sched._all_sigmas = np.array(sigmas, np.float32)
    sched._all_t = np.arange(len(sigmas) - 1, 0, -1, dtype=np.float64) * 100
    sched._plan(0)
    x, out = np.full((1,), x0, np.float32), []
    for i, t in enumerate(sched.timesteps):
        eps = np.array([(float(x[0]) - estimates[i]) / float(sched.sigmas[i])], np.float32)
        x = sched.step(eps, t, x, noise=lambda shape: np.ones(shape, np.float32))
        out.append(float(x[0]))
    return sched, out


def test_heunpp2_worked_example() -> None:
    # sigmas 2, 1, 0.5, 0; x = 3; x0 estimates D at the calls (2, 1, 0.5 | 1, 0.5 | 0.5).
    sched, xs = _drive("heunpp2", [2.0, 1.0, 0.5, 0.0], 3.0, [1.0, 0.5, 0.25, 0.2, 0.1, 0.05])
    assert np.allclose(sched.sigmas[:-1], [2, 1, 0.5, 1, 0.5, 0.5])  # 3 + 2 + 1 calls
    # step 0 (three calls): d = (3-1)/2 = 1, dt = -1; x2 = 2, d2 = (2-0.5)/1 = 1.5;
    # x3 = 2 + 1.5 * -0.5 = 1.25, d3 = (1.25-0.25)/0.5 = 2; w2 = 1/6, w3 = 0.5/6, w1 = 0.75:
    # x = 3 - (0.75 + 1.5/6 + 2 * 0.5/6) = 11/6
    assert xs[:3] == pytest.approx([2.0, 1.25, 11 / 6], abs=1e-6)
    # step 1 (two calls, w2 = 0.5 / (2 * 2) = 0.125): d = 11/6 - 0.2, x2 = 11/6 - 0.5 d,
    # d2 = (x2 - 0.1) / 0.5, x = 11/6 - 0.5 (0.875 d + 0.125 d2)
    d = 11 / 6 - 0.2
    x2 = 11 / 6 - 0.5 * d
    assert xs[3:5] == pytest.approx([x2, 11 / 6 - 0.5 * (0.875 * d + 0.125 * (x2 - 0.1) / 0.5)], abs=1e-6)
    assert xs[5] == pytest.approx(0.05, abs=1e-6)  # step 2: Euler to 0 lands on D


def test_ddpm_worked_example() -> None:
    # sigma 1 -> 0.5: a = 1/2, a' = 0.8, alpha = 0.625; x = 2, D = 1: eps = 1, x_vp = 2 / sqrt(2);
    # mu = sqrt(1.6) (sqrt(2) - 0.375 / sqrt(0.5)) + sqrt(0.375 * 0.2 / 0.5) z (z = 1), x = mu sqrt(1.25);
    # then sigma 0.5 -> 0 with D = 0.3: x = D (up to rounding), no noise.
    _, xs = _drive("ddpm", [1.0, 0.5, 0.0], 2.0, [1.0, 0.3])
    mu = math.sqrt(1.6) * (math.sqrt(2) - 0.375 / math.sqrt(0.5)) + math.sqrt(0.375 * 0.2 / 0.5)
    assert xs == pytest.approx([mu * math.sqrt(1.25), 0.3], abs=1e-6)


def test_ddim_on_sigmas_worked_example() -> None:
    # ComfyUI's ddim is Euler: sigmas 2, 1, 0.5, 0; x = 4; D = 0.3, -0.2, 0.1.
    # d = (4 - 0.3) / 2 = 1.85, x = 4 - 1.85 = 2.15; d = (2.15 + 0.2) / 1 = 2.35, x = 2.15 - 1.175 = 0.975;
    # d = (0.975 - 0.1) / 0.5 = 1.75, x = 0.975 - 0.875 = 0.1 (the last step lands on D)
    sched, xs = _drive("DDIM Karras", [2.0, 1.0, 0.5, 0.0], 4.0, [0.3, -0.2, 0.1])
    assert sched.name == "ddim_sigmas"
    assert xs == pytest.approx([2.15, 0.975, 0.1], abs=1e-6)


def test_lcm_on_sigmas_worked_example() -> None:
    # ComfyUI's sample_lcm: x = D + s[i+1] z (z = 1), the last step x = D: 0.3 + 1, -0.2 + 0.5, 0.1.
    sched, xs = _drive("LCM Karras", [2.0, 1.0, 0.5, 0.0], 4.0, [0.3, -0.2, 0.1])
    assert sched.name == "lcm_sigmas"
    assert xs == pytest.approx([1.3, 0.3, 0.1], abs=1e-6)


def test_ddim_and_lcm_pairs_resolve() -> None:
    """A schedule diffusers' DDIM / LCM lack picks ComfyUI's ddim / lcm on sigmas; theirs stay."""
    for name in ("DDIM Karras", "ddim_karras", "k_ddim_karras"):
        assert resolve(name) == ("ddim_sigmas", "karras")
    assert resolve("ddim", "exponential") == ("ddim_sigmas", "exponential")
    assert resolve("DDIM", "Align Your Steps") == ("ddim_sigmas", "align_your_steps")
    assert resolve("lcm", "kl_optimal") == ("lcm_sigmas", "kl_optimal")
    assert resolve("LCM Beta") == ("lcm_sigmas", "beta")
    assert resolve("DDIM") == ("ddim", "normal")
    assert resolve("ddim", "sgm_uniform") == ("ddim", "sgm_uniform")
    assert resolve("LCM") == ("lcm", "normal")
    assert resolve("lcm", "sgm_uniform") == ("lcm_sigmas", "sgm_uniform")  # diffusers' LCM has only its own
    assert type(create_scheduler("DDIM")).__name__ == "DDIM"
    assert type(create_scheduler("LCM")).__name__ == "LCM"
    assert sampler_label("ddim_sigmas") == "DDIM"
    assert sampler_label("lcm_sigmas") == "LCM"
    with pytest.raises(OptionError, match="eta"):  # ComfyUI's ddim has no eta
        create_scheduler("DDIM Karras", eta=0.5)
    with pytest.raises(OptionError, match="schedule"):  # TCD: no sigma-schedule variant
        create_scheduler("TCD", schedule="karras")


def test_euler_cfg_pp_worked_example() -> None:
    # sigma 2 -> 1, x = 3, guided D = 1, unguided U = 0.4 (alpha = 1 for a sigma model):
    # d = (3 - 0.4) / 2 = 1.3; x = D + 1 * d = 2.3. Plain Euler would give 3 + (3-1)/2 * -1 = 2.
    sched = create_scheduler("euler_cfg_pp")
    sched.set_timesteps(2)
    sched._all_sigmas = np.array([2.0, 1.0, 0.0], np.float32)
    sched._plan(0)
    x = np.array([3.0], np.float32)
    out = sched.step(np.array([1.0], np.float32), sched.timesteps[0], x, uncond=np.array([1.3], np.float32))
    assert float(out[0]) == pytest.approx(2.3, abs=1e-6)  # eps 1 -> D = 1; eps_u 1.3 -> U = 0.4


def test_dpmpp_2m_cfg_pp_worked_example() -> None:
    # sigmas 2, 1, 0.5: h = log 2 each step, exp(-h) = 0.5, expm1(-h) = -0.5, r = 1.
    # step 0: x = D0 - 0.5 U0 + 0.5 x = 1 - 0.2 + 1.5 = 2.3 (x = 3, D0 = 1, U0 = 0.4)
    # step 1: x = D1 - 0.5 U1 + 0.5 * (D1 - U0) * 0.5 + 0.5 x with D1 = 0.8, U1 = 0.6:
    #         0.8 - 0.3 + 0.1 + 1.15 = 1.75
    sched = create_scheduler("dpmpp_2m_cfg_pp")
    sched.set_timesteps(3)
    sched._all_sigmas = np.array([2.0, 1.0, 0.5, 0.0], np.float32)
    sched._plan(0)
    x = np.array([3.0], np.float32)
    x = sched.step(np.array([1.0], np.float32), sched.timesteps[0], x, uncond=np.array([1.3], np.float32))
    assert float(x[0]) == pytest.approx(2.3, abs=1e-6)
    eps, eps_u = (2.3 - 0.8) / 1.0, (2.3 - 0.6) / 1.0
    x = sched.step(np.array([eps], np.float32), sched.timesteps[1], x, uncond=np.array([eps_u], np.float32))
    assert float(x[0]) == pytest.approx(1.75, abs=1e-6)


def test_rf_ancestral_worked_example() -> None:
    # Flow Euler a, sigma 0.8 -> 0.4, x = 1, D = 0.2, noise z = 1: sigma_down = 0.4 * 0.5 = 0.2,
    # ratio 0.25: x = 0.25 + 0.75 * 0.2 = 0.4; rescale (0.6 / 0.8) = 0.75;
    # renoise sqrt(0.16 - 0.04 * 0.36 / 0.64) = sqrt(0.1375): x = 0.3 + sqrt(0.1375)
    sched = create_scheduler("euler_a", config={"_class_name": "FlowMatchEulerDiscreteScheduler"})
    assert sched.name == "euler_a_flow"
    sched.set_timesteps(2)
    sched._all_sigmas = np.array([0.8, 0.4, 0.0], np.float32)
    sched._all_t = np.array([800.0, 400.0])
    sched._plan(0)
    v = np.array([(1.0 - 0.2) / 0.8], np.float32)
    out = sched.step(v, sched.timesteps[0], np.ones(1, np.float32), noise=lambda shape: np.ones(shape, np.float32))
    assert float(out[0]) == pytest.approx(0.3 + math.sqrt(0.1375), abs=1e-6)


def test_lms_coefficients_against_closed_forms() -> None:
    """Order 1 is the step length; order 2 on nodes t0, t1 over [t1, t2] is the integral of
    the two linear Lagrange bases (Adams-Bashforth 2 for equal steps: 3/2 h and -1/2 h)."""
    t = np.array([3.0, 2.0, 1.0, 0.0])
    assert lms_coefficient(1, t, 0, 0) == pytest.approx(-1.0)
    assert lms_coefficient(2, t, 1, 0) == pytest.approx(-1.5)
    assert lms_coefficient(2, t, 1, 1) == pytest.approx(0.5)
    # AB3 for equal steps h = -1: 23/12 h, -16/12 h, 5/12 h
    assert [lms_coefficient(3, t, 2, j) for j in range(3)] == pytest.approx([-23 / 12, 16 / 12, -5 / 12])


# -- the scheduler contract for multi-call samplers ---------------------------------------------------


def test_timesteps_list_every_model_call() -> None:
    sched = create_scheduler("DPM2")
    sched.set_timesteps(4)
    assert len(sched.timesteps) == 7  # two calls per step, one on the step to sigma 0 (as KDPM2)
    assert sched.order == 2
    lms = create_scheduler("LMS Karras")
    lms.set_timesteps(5)
    assert len(lms.timesteps) == 5 and lms.schedule == "karras"


def test_img2img_starts_at_a_step_of_the_tail() -> None:
    full = create_scheduler("dpm_2")
    full.set_timesteps(6)
    tail = create_scheduler("dpm_2")
    tail.set_timesteps(6, strength=0.5)  # the last 3 steps: 2 + 2 + 1 calls
    assert len(tail.timesteps) == 5
    assert tail.timesteps[0] == full.timesteps[6]
    x = np.ones((1, 4, 2, 2), np.float32)
    start = tail.add_noise(x, x, tail.timesteps[0])
    assert np.allclose(start, x + x * tail.sigmas[0])


def test_set_begin_index_starts_at_a_step() -> None:
    sched = create_scheduler("dpm_2")
    sched.set_timesteps(6)
    sched.set_begin_index(4)  # step 2 (calls 0-1, 2-3 before it)
    assert len(sched.timesteps) == 7
    sched.set_timesteps(6)
    with pytest.raises(InputError, match="first model call of a step"):
        sched.set_begin_index(3)
    heunpp2 = create_scheduler("heunpp2")  # 3, 3, 3, 2, 1 calls: step 4 starts at call 11, not 12
    heunpp2.set_timesteps(5)
    heunpp2.set_begin_index(11)
    assert len(heunpp2.timesteps) == 1
    restart = create_scheduler("Restart")  # the hires fix at 24 steps keeping 12: the schedule's tail
    restart.set_timesteps(24)
    full = restart.sigmas.copy()
    restart.set_begin_index(12 * restart.order)
    assert len(restart.timesteps) == 2 * 12 - 1  # 12 steps left: below 20, no restart segments
    assert restart.sigmas[0] == restart._all_sigmas[12] and restart.sigmas[0] not in full[:-1]


def test_flow_variants_resolve_and_label() -> None:
    flow = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    for name, variant in [
        ("Euler a", "euler_a_flow"),
        ("Heun", "heun_flow"),
        ("DPM++ 2M", "dpmpp_2m_flow"),
        ("DPM++ 2S a", "dpmpp_2s_a_flow"),
        ("LMS", "lms_flow"),
        ("DPM2", "dpm_2_flow"),
        ("DPM2 a", "dpm_2_a_flow"),
        ("heunpp2", "heunpp2_flow"),
        ("Euler CFG++", "euler_cfg_pp_flow"),
        ("DPM++ 2M SDE", "dpmpp_2m_sde_flow"),
        ("k_dpmpp_2m_sde_karras", "dpmpp_2m_sde_flow"),
        ("DPM++ 3M SDE", "dpmpp_3m_sde_flow"),
        ("dpmpp_3m_sde", "dpmpp_3m_sde_flow"),
        ("DDPM", "ddpm_flow"),
        ("DPM++ 2M CFG++", "dpmpp_2m_cfg_pp_flow"),
        ("dpmpp_2m_cfg_pp", "dpmpp_2m_cfg_pp_flow"),
        ("DPM++ SDE", "dpmpp_sde_flow"),
        ("DPM++ SDE Karras", "dpmpp_sde_flow"),
        ("dpmpp_sde_gpu", "dpmpp_sde_flow"),
        ("DDIM", "ddim_flow"),
        ("DDIM Karras", "ddim_flow"),  # resolves to ddim_sigmas, whose base ddim has the flow variant
        ("ddim_trailing", "ddim_flow"),
        ("LCM", "lcm_flow"),
        ("LCM Karras", "lcm_flow"),
    ]:
        sched = create_scheduler(name, config=flow)
        assert sched.name == variant
        assert sampler_label(variant) == sampler_label(scheduler_class(name).name)
        sched.set_timesteps(4)
        assert float(sched.sigmas[0]) <= 1.0 and float(sched.sigmas[-1]) == 0.0
    with pytest.raises(OptionError, match="clip_sample"):
        create_scheduler("DDPM", config={"clip_sample": True})


def test_flow_refusals_say_why() -> None:
    """Restart and TCD have no flow variant, and the refusal says why (ComfyUI's core has neither;
    A1111/Forge's Restart re-noises the variance-exploding way); DDIM's eta has no flow form."""
    flow = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    with pytest.raises(OptionError, match=r"no Restart sampler.*variance-exploding.*use one of .*ddim_flow"):
        create_scheduler("Restart", config=flow)
    with pytest.raises(OptionError, match="ComfyUI's core has no TCD sampler"):
        create_scheduler("TCD", config=flow)
    with pytest.raises(OptionError, match="no eta"):
        create_scheduler("DDIM", config=flow, eta=0.5)
    assert create_scheduler("DDIM", config=flow, eta=0.0).name == "ddim_flow"
    assert type(create_scheduler("DDIM")).__name__ == "DDIM"  # epsilon models: unchanged


def test_lcm_flow_worked_example() -> None:
    """ComfyUI's lcm on a flow model (CONST noise_scaling): x = s' z + (1 - s') x0 estimate; on the
    sigmas [1, 0.75, 0.5, 0] from x = 1.5 with estimates 0.3, -0.2, 0.1 and draws z = 1:
    0.75 + 0.25 * 0.3 = 0.825, 0.5 + 0.5 * -0.2 = 0.4, then the last estimate 0.1."""
    sched = create_scheduler("LCM", config={"_class_name": "FlowMatchEulerDiscreteScheduler"})
    sched.set_timesteps(3)
    sched._all_sigmas = np.array([1.0, 0.75, 0.5, 0.0], np.float32)
    sched._plan(0)
    x, out = np.full((1,), 1.5, np.float32), []
    for i, (t, estimate) in enumerate(zip(sched.timesteps, [0.3, -0.2, 0.1], strict=True)):
        v = np.array([(float(x[0]) - estimate) / float(sched.sigmas[i])], np.float32)  # x0 = x - sigma v
        x = sched.step(v, t, x, noise=lambda shape: np.ones(shape, np.float32))
        out.append(float(x[0]))
    assert out == pytest.approx([0.825, 0.4, 0.1], rel=1e-6)


def test_dpmpp_sde_flow_calls_and_draws() -> None:
    """ComfyUI's dpmpp_sde on a flow model: two model calls per step but the last (the second at the
    midpoint sigmoid(-lambda_m) of the half log-SNR), the first at percent_to_sigma(1e-4); two draws
    per two-call step, none with s_noise 0."""
    flow = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    for s_noise, draws in ((1.0, 2 * 3), (0.0, 0)):
        sched = create_scheduler("DPM++ SDE", config=flow, s_noise=s_noise)
        sched.set_timesteps(4)
        assert len(sched.timesteps) == 2 * 4 - 1
        s = sched.sigmas.astype(np.float64)
        assert s[0] == pytest.approx(3 * (1 - 1e-4) / (1 + 2 * (1 - 1e-4)), rel=1e-7)
        lam = np.log((1 - s[:-1]) / s[:-1])
        assert s[1] == pytest.approx(1 / (1 + np.exp((lam[0] + lam[2]) / 2)), rel=1e-5)
        used: list[tuple[int, ...]] = []

        def draw(shape: tuple[int, ...], used: list[tuple[int, ...]] = used) -> Any:
            used.append(shape)
            return np.ones(shape, np.float32)

        x = np.ones((1, 2), np.float32)
        for t in sched.timesteps:
            x = sched.step(np.zeros_like(x), t, x, noise=draw)
        assert len(used) == draws and np.isfinite(x).all()


def test_dpmpp_sde_flow_worked_example() -> None:
    """ComfyUI's dpmpp_sde on a flow model, in closed form (eta 1: k-diffusion's ancestral split
    between the VE sigmas exp(-lambda) gives sigma_down = sigma_to^2 / sigma_from, so each half's
    decay is exp(-2 (lambda_to - lambda_s)) and its noise alpha_to sigma_up = sigma_to sqrt(1 - that)),
    in Python floats, on an img2img tail [0.8, 0.6, 0.3, 0] (no first-sigma offset; the offset first
    step is ill-conditioned in float32, see sdkit.schedulers.k_solvers): lambda = log((1 - s) / s),
    h = lambda' - lambda, sigma_m = sigmoid(-(lambda + h / 2)), alpha = 1 - sigma,
    x2 = (alpha_m / alpha) e^-h x + alpha_m (1 - e^-h) D + sigma_m sqrt(1 - e^-h) z1,
    x' = (alpha' / alpha) e^-2h x + alpha' (1 - e^-2h) D2 + s' sqrt(1 - e^-2h) n2, n2 the Brownian
    increment over [s', s] holding z1's over [sigma_m, s]; the step to 0 is x = D."""
    sigmas, estimates, draws = [0.8, 0.6, 0.3, 0.0], [0.4, 0.42, 0.45, 0.47, 0.5], [1.0, -0.5, 0.25, 0.75]
    expected, x, calls, z = [], 1.5, iter(estimates), iter(draws)
    for s, s_next in itertools.pairwise(sigmas):
        d = next(calls)
        if s_next == 0:
            expected.append(d)
            continue
        lam, lam_next = math.log((1 - s) / s), math.log((1 - s_next) / s_next)
        h = lam_next - lam
        sigma_m = 1 / (1 + math.exp(lam + h / 2))
        z1, z2 = next(z), next(z)
        x2 = (1 - sigma_m) / (1 - s) * math.exp(-h) * x + (1 - sigma_m) * -math.expm1(-h) * d
        expected.append(x2 + sigma_m * math.sqrt(-math.expm1(-h)) * z1)
        n2 = (math.sqrt(s - sigma_m) * z1 + math.sqrt(sigma_m - s_next) * z2) / math.sqrt(s - s_next)
        d2 = next(calls)
        x = (1 - s_next) / (1 - s) * math.exp(-2 * h) * x + (1 - s_next) * -math.expm1(-2 * h) * d2
        x += s_next * math.sqrt(-math.expm1(-2 * h)) * n2
        expected.append(x)
    sched = create_scheduler("DPM++ SDE", config={"_class_name": "FlowMatchEulerDiscreteScheduler"})
    sched.set_timesteps(3)
    sched._all_sigmas = np.array(sigmas, np.float32)
    sched._plan(0)
    assert len(sched.timesteps) == len(estimates)
    xs, tape = np.full((1,), 1.5, np.float32), iter(draws)
    for i, t in enumerate(sched.timesteps):
        v = np.array([(float(xs[0]) - estimates[i]) / float(sched.sigmas[i])], np.float32)  # x0 = x - sigma v
        xs = sched.step(v, t, xs, noise=lambda shape: np.full(shape, next(tape), np.float32))
        # after a step's first call: x2, the sample the midpoint call sees; after its second: x'
        assert float(xs[0]) == pytest.approx(expected[i], rel=1e-6, abs=1e-7), i
    assert next(tape, None) is None


def test_labels_and_names() -> None:
    labels = {
        "DPM2": "dpm_2",
        "DPM2 a": "dpm_2_a",
        "DPM++ 2S a": "dpmpp_2s_a",
        "DPM++ 3M SDE": "dpmpp_3m_sde",
        "LMS": "lms",
        "DDPM": "ddpm",
        "Heun++ 2": "heunpp2",
        "Euler CFG++": "euler_cfg_pp",
        "DPM++ 2M CFG++": "dpmpp_2m_cfg_pp",
        "Restart": "restart",
        "DPM++ 2M SDE": "dpmpp_2m_sde",
    }
    comfy = ["dpm_2", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_3m_sde", "lms", "ddpm", "heunpp2"]
    for label, name in labels.items():
        assert scheduler_class(label).name == name
        assert sampler_label(name) == label
    for name in [*comfy, "euler_cfg_pp", "dpmpp_2m_cfg_pp"]:
        assert scheduler_class(name).name in labels.values()
    assert create_scheduler("DPM2 a Karras").schedule == "karras"
    assert create_scheduler("DPM++ 3M SDE Exponential").schedule == "exponential"


FLOW_SDE_EXAMPLE = FIXTURES / "flow_sde_example.json"


@pytest.mark.skipif(not FLOW_SDE_EXAMPLE.is_file(), reason=f"{FLOW_SDE_EXAMPLE} not found")
@pytest.mark.parametrize("sampler", ["dpmpp_2m_sde", "dpmpp_3m_sde"])
def test_flow_sde_worked_example(sampler: str) -> None:
    """The 4-step SD3 case written down in sdkit.schedulers.k_solvers, against the numbers of
    fixtures/schedulers/make_flow_sde_example.py (Python floats from the written-down algorithm;
    sdkit runs float32: 1e-6 relative, measured 1.8e-7)."""
    example = json.loads(FLOW_SDE_EXAMPLE.read_text())
    sched = create_scheduler(sampler, config={"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0})
    assert sched.name == f"{sampler}_flow"
    sched.set_timesteps(4)
    assert sched.sigmas.tolist() == pytest.approx(example["run_sigmas"], rel=1e-6, abs=0)
    assert float(sched.sigmas[0]) == np.float32(example["offset_sigma"])  # percent_to_sigma(1e-4), float32
    draws = iter(example["draws"])
    x = np.full((1,), example["x_start"], np.float32)
    for i, t in enumerate(sched.timesteps):
        v = np.array([(float(x[0]) - example["estimates"][i]) / float(sched.sigmas[i])], np.float32)
        x = sched.step(v, t, x, noise=lambda shape: np.full(shape, next(draws), np.float32))
        assert float(x[0]) == pytest.approx(example[sampler][i], rel=1e-6, abs=1e-7)
    assert next(draws, None) is None  # one draw per step but the last


def test_flow_sde_first_sigma_offset() -> None:
    """ComfyUI's offset_first_sigma_for_snr: only a first sigma >= 1 moves, to the model's
    percent_to_sigma(1e-4) (Flux: mu from the resolution); img2img's tail and the samplers that do
    not use the half log-SNR (DDPM, DPM++ 2M CFG++, Euler a) keep the schedule's sigmas."""
    flux = {"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True}
    sched = create_scheduler("DPM++ 3M SDE", config=flux)
    sched.set_timesteps(5, mu=1.15)
    example = json.loads(FLOW_SDE_EXAMPLE.read_text()) if FLOW_SDE_EXAMPLE.is_file() else {}
    offset = math.exp(1.15) / (math.exp(1.15) + (1 / (1 - 1e-4) - 1))
    assert float(sched.sigmas[0]) == np.float32(offset) == np.float32(example.get("flux_offset_sigma_1024px", offset))
    assert float(sched.timesteps[0]) == pytest.approx(offset * 1000, rel=1e-6)
    sched.set_timesteps(5, strength=0.6, mu=1.15)
    assert float(sched.sigmas[0]) < 0.99 and sched.sigmas[0] == sched._all_sigmas[sched._first]
    for name in ("DDPM", "DPM++ 2M CFG++", "Euler a"):
        other = create_scheduler(name, config=flux)
        other.set_timesteps(5, mu=1.15)
        assert float(other.sigmas[0]) == 1.0


def test_comfyui_gpu_names_and_tcd_schedules() -> None:
    """ComfyUI's *_gpu SDE samplers differ from theirs only in where the Brownian tree draws (sdkit
    draws its own noise for both): same classes, and the flow variants on a flow model. TCD on a
    sigma schedule is refused with the reason (ComfyUI's core has no TCD sampler to follow)."""
    flow = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    for name, canonical in [
        ("dpmpp_2m_sde_gpu", "dpmpp_2m_sde"),
        ("dpmpp_3m_sde_gpu", "dpmpp_3m_sde"),
        ("dpmpp_sde_gpu", "dpmpp_sde"),
    ]:
        assert resolve(name) == (canonical, "normal")
        assert resolve(f"{name} karras") == (canonical, "karras")
    assert create_scheduler("dpmpp_3m_sde_gpu", config=flow).name == "dpmpp_3m_sde_flow"
    with pytest.raises(OptionError, match="ComfyUI's core has no TCD sampler"):
        create_scheduler("TCD Karras")


def test_restart_segments() -> None:
    """A1111's automatic restart list: below 20 steps plain Heun over the schedule; at 20 the main
    schedule is 11 Karras steps and, after the step nearest sigma 0.1, 9 segments from the sigma
    nearest 2 back down to it; at 36, 18 main steps and that segment (10 sigmas) twice."""
    sigmas = np.append(np.geomspace(14.6, 0.03, 8), 0).astype(np.float32)
    assert restart_pairs(sigmas) == list(itertools.pairwise(sigmas))
    for steps, main, extra in ((20, 11, 9), (36, 18, 18)):
        sigmas = np.append(np.geomspace(14.6, 0.03, steps), 0).astype(np.float32)
        pairs = restart_pairs(sigmas)
        assert len(pairs) == main + extra
        jumps = [k for k in range(1, len(pairs)) if pairs[k][0] > pairs[k - 1][1]]
        assert len(jumps) == extra // 9  # each restart adds noise once
        assert abs(float(pairs[jumps[0]][0]) - 2) < 0.6 and abs(float(pairs[jumps[0] - 1][1]) - 0.1) < 0.05
    sched = create_scheduler("Restart")
    sched.set_timesteps(20)
    assert len(sched.timesteps) == 2 * 20 - 1  # Heun: two calls per segment, one on the last


def test_tolerance_exceptions_are_real_cases() -> None:
    keys = {c["key"] for c in GOLDEN.cases("ksolver_cases") + GOLDEN.cases("ksolver_diffusers_cases")}
    assert set(TOLERANCE) <= keys
    assert all(tol <= 5e-6 for tol in TOLERANCE.values())
