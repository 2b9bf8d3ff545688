"""euler_flow against diffusers' FlowMatchEulerDiscreteScheduler (golden.npz ``flow/...`` cases).

Each case replays a diffusers run (fixtures/schedulers/make_golden.py ``run_flow_case``): the
published SD3 / FLUX.1-dev / FLUX.1-schnell scheduler configs, ``mu`` from the image sequence
length, Flux's ``sigmas=linspace(1, 1/n, n)``, ComfyUI's schedules handed to diffusers as
unshifted sigmas, and img2img through ``scale_noise``. Teacher-forced like the discrete cases,
with the same tolerance: 1e-6, relative above 1 (timesteps reach 1000).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scheduler_goldens import GOLDEN, max_scaled_error

from sdkit.errors import InputError, OptionError
from sdkit.schedulers import create_scheduler, sampler_label, scheduler_class
from sdkit.schedulers.flow_match import FlowMatchEuler, linear_sigmas

TOL = 1e-6  # |ours - diffusers| <= TOL * max(1, |diffusers|), as the discrete samplers' cases


def flow_config(name: str) -> dict[str, Any]:
    return dict(GOLDEN.meta["flow_configs"][name])


pytestmark = pytest.mark.skipif(not GOLDEN.is_file(), reason=f"{GOLDEN} not found")


def make(spec: dict[str, Any]) -> tuple[FlowMatchEuler, dict[str, np.ndarray]]:
    rec = GOLDEN.case(spec["key"])
    sched = create_scheduler("Euler", schedule=spec["schedule"], config=flow_config(spec["config"]))
    assert isinstance(sched, FlowMatchEuler)
    kwargs: dict[str, Any] = {}
    if spec["image_seq_len"] is not None:
        kwargs["mu"] = sched.mu_for(spec["image_seq_len"])
        assert abs(kwargs["mu"] - float(rec["mu"])) <= 1e-12
    if spec["sigmas"] == "linear":
        kwargs["sigmas"] = linear_sigmas(spec["steps"])
    sched.set_timesteps(spec["steps"], strength=spec["strength"], **kwargs)
    return sched, rec


@pytest.mark.parametrize("spec", GOLDEN.cases("flow_cases"), ids=lambda c: c["key"])
def test_matches_diffusers(spec: dict[str, Any]) -> None:
    sched, rec = make(spec)
    tail = len(rec["all_sigmas"]) - len(sched.sigmas)
    assert max_scaled_error(sched.sigmas, rec["all_sigmas"][tail:]) <= TOL
    assert sched.timesteps.dtype == np.float32
    assert max_scaled_error(sched.timesteps, rec["timesteps"]) <= TOL
    if spec["strength"] < 1.0:
        start = sched.add_noise(rec["clean"], rec["init_noise"], sched.timesteps[0])
    else:
        assert sched.init_noise_sigma == 1.0
        start = rec["init_noise"]
    assert max_scaled_error(start, rec["start"]) <= TOL
    latents = rec["start"]
    for i, t in enumerate(sched.timesteps):
        model_in = sched.scale_model_input(latents, t)
        assert model_in is latents or np.array_equal(model_in, latents)  # the identity
        out = sched.step(rec["model_out"][i], t, latents)
        err = max_scaled_error(out, rec["prev"][i])
        assert err <= TOL, f"step {i} (t={t}): scaled error {err:.3g}"
        latents = rec["prev"][i]
    assert len(sched.timesteps) == len(rec["prev"])


def test_every_flow_schedule_and_config_is_covered() -> None:
    specs = GOLDEN.cases("flow_cases")
    # kl_optimal and linear_quadratic have no diffusers form: checked against ComfyUI's formulas
    # in test_sigma_schedules.py
    assert {s["schedule"] for s in specs} == set(FlowMatchEuler.schedules) - {"kl_optimal", "linear_quadratic"}
    assert {s["config"] for s in specs} >= {"sd3", "flux_dev", "flux_schnell"}
    assert any(s["strength"] < 1 for s in specs)


def test_euler_on_a_flow_model_is_euler_flow() -> None:
    flux = {"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True}
    assert isinstance(create_scheduler("Euler", config=flux), FlowMatchEuler)
    assert isinstance(create_scheduler("euler", prediction_type="flow"), FlowMatchEuler)
    assert scheduler_class("k_euler", prediction_type="flow") is FlowMatchEuler
    assert scheduler_class("euler", prediction_type="epsilon").name == "euler"
    assert sampler_label("euler_flow") == "Euler"
    with pytest.raises(OptionError, match=r"does not run 'flow' models .*; use one of"):
        create_scheduler("Restart Karras", config=flux)
    with pytest.raises(OptionError, match="does not run 'epsilon'"):
        create_scheduler("euler_flow", prediction_type="epsilon")


def test_dynamic_shifting_needs_mu() -> None:
    sched = create_scheduler("Euler", config=flow_config("flux_dev"))
    assert sched.uses_dynamic_shifting  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"mu=scheduler\.mu_for"):
        sched.set_timesteps(4)
    # diffusers' calculate_shift: base_shift at 256 tokens, max_shift at 4096
    assert math.isclose(sched.mu_for(256), 0.5) and math.isclose(sched.mu_for(4096), 1.15)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"sigmas": [1.0, 0.5]}, "sigmas must be 3 values"),
        ({"sigmas": [1.0, 0.5, 0.0]}, "sigmas must be 3 values in"),
        ({"mu": float("nan")}, "mu must be a finite number"),
    ],
)
def test_bad_set_timesteps_arguments(kwargs: dict[str, Any], error: str) -> None:
    sched = create_scheduler("Euler", config=flow_config("sd3"))
    with pytest.raises(InputError, match=error):
        sched.set_timesteps(3, **kwargs)


def test_sigmas_do_not_combine_with_table_schedules() -> None:
    sched = create_scheduler("Euler", schedule="simple", config=flow_config("sd3"))
    with pytest.raises(OptionError, match="cannot be combined with 'simple'"):
        sched.set_timesteps(3, sigmas=[1.0, 0.6, 0.3])  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"stochastic_sampling": True}, "stochastic sampling"),
        ({"invert_sigmas": True}, "inverted sigmas"),
        ({"time_shift_type": "cosine"}, "time_shift_type"),
        ({"shift": "3"}, "must be a number"),
        ({"shift_terminal": 1.5}, "shift_terminal"),
    ],
)
def test_unsupported_flow_settings_are_refused(extra: dict[str, Any], error: str) -> None:
    with pytest.raises(OptionError, match=error):
        create_scheduler("Euler", config={"_class_name": "FlowMatchEulerDiscreteScheduler", **extra})
