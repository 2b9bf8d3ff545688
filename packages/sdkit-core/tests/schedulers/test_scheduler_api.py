"""The scheduler contract the pipelines use: shapes, dtypes, img2img, and clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sdkit.errors import InputError, OptionError, UnknownSchedulerError
from sdkit.schedulers import SCHEDULES, create_scheduler, noise_from_seed, scheduler_class, scheduler_names
from sdkit.schedulers.base import SD15_CONFIG

SHAPE = (1, 4, 3, 3)
BUILTINS = ["euler", "euler_a", "heun", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde", "ddim", "lcm"]
ISSUE_27 = ["uni_pc", "uni_pc_bh2", "deis", "ipndm", "ipndm_v", "tcd"]  # UniPC, DEIS, iPNDM, TCD
COMBINATIONS = [(name, schedule) for name in BUILTINS + ISSUE_27 for schedule in scheduler_class(name).schedules]


def _fake_model(x: np.ndarray, t: Any) -> np.ndarray:
    return (0.9 * np.tanh(x) + 0.1 * np.sin(float(t) * 0.01)).astype(np.float32)


@pytest.mark.parametrize(("name", "schedule"), COMBINATIONS)
def test_txt2img_loop_runs(name: str, schedule: str) -> None:
    sched = create_scheduler(name, schedule)
    sched.set_timesteps(5)
    draw = noise_from_seed(0)
    latents = draw(SHAPE) * sched.init_noise_sigma
    evaluations = 0
    for t in sched.timesteps:
        out = _fake_model(sched.scale_model_input(latents, t), t)
        latents = sched.step(out, t, latents, noise=draw)
        evaluations += 1
        assert latents.dtype == np.float32
    assert np.isfinite(latents).all()
    expected = 2 * 5 - 1 if sched.order == 2 else 5
    assert evaluations == len(sched.timesteps) == expected
    assert len(sched.sigmas) == len(sched.timesteps) + 1
    assert sched.sigmas[-1] == 0.0


@pytest.mark.parametrize("name", ["euler", "heun", "dpmpp_2m", "ddim", "uni_pc", "deis", "ipndm_v"])
def test_img2img_keeps_the_tail(name: str) -> None:
    full = create_scheduler(name)
    full.set_timesteps(10)
    sched = create_scheduler(name)
    sched.set_timesteps(10, strength=0.5)
    skip = 5 * sched.order
    np.testing.assert_array_equal(sched.timesteps, full.timesteps[skip:])
    np.testing.assert_array_equal(sched.sigmas, full.sigmas[skip:])
    clean = np.ones(SHAPE, np.float32)
    noise = noise_from_seed(1)(SHAPE)
    noisy = sched.add_noise(clean, noise, sched.timesteps[0])
    assert noisy.dtype == np.float32
    assert noisy.shape == SHAPE
    latents = noisy
    for t in sched.timesteps:
        latents = sched.step(_fake_model(sched.scale_model_input(latents, t), t), t, latents)
    assert np.isfinite(latents).all()


def test_k_sampler_add_noise_is_x_plus_sigma_noise() -> None:
    sched = create_scheduler("euler")
    sched.set_timesteps(10, strength=0.3)
    clean, noise = np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)
    np.testing.assert_array_equal(sched.add_noise(clean, noise, sched.timesteps[0]), np.full(SHAPE, sched.sigmas[0]))


def test_noise_from_seed_is_reproducible() -> None:
    a, b = noise_from_seed(5), noise_from_seed(5)
    first = a((2, 3))
    assert first.dtype == np.float32
    np.testing.assert_array_equal(first, b((2, 3)))
    assert not np.array_equal(a((2, 3)), first)


def test_same_noise_same_result() -> None:
    results = []
    for _ in range(2):
        sched = create_scheduler("dpmpp_2m_sde", "karras")
        sched.set_timesteps(4)
        draw = noise_from_seed(3)
        x = draw(SHAPE) * sched.init_noise_sigma
        for t in sched.timesteps:
            x = sched.step(_fake_model(sched.scale_model_input(x, t), t), t, x, noise=draw)
        results.append(x)
    np.testing.assert_array_equal(results[0], results[1])


def test_config_none_is_stable_diffusion_1() -> None:
    a, b = create_scheduler("euler", config=None), create_scheduler("euler", config=SD15_CONFIG)
    np.testing.assert_array_equal(a.alphas_cumprod, b.alphas_cumprod)
    assert a.config.beta_schedule == "scaled_linear"
    assert a.config.steps_offset == 1


def test_prediction_type_argument_overrides_config() -> None:
    config = {**SD15_CONFIG, "prediction_type": "epsilon"}
    assert create_scheduler("euler", config=config, prediction_type="v_prediction").prediction_type == "v_prediction"
    assert create_scheduler("euler", config={**config, "prediction_type": "v_prediction"}).prediction_type == (
        "v_prediction"
    )


def test_diffusers_config_extras_are_accepted() -> None:
    config = {**SD15_CONFIG, "_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "skip_prk_steps": True}
    sched = create_scheduler("dpmpp_2m", config=config)
    assert sched.config.extra["skip_prk_steps"] is True


@pytest.mark.parametrize(
    ("name", "config_change", "message"),
    [
        ("euler", {"rescale_betas_zero_snr": True}, "rescale_betas_zero_snr"),
        ("euler", {"prediction_type": "sample"}, "prediction_type"),
        ("euler", {"timestep_spacing": "random"}, "timestep_spacing"),
        ("euler", {"beta_schedule": "cubic"}, "beta_schedule"),
        ("euler", {"num_train_timesteps": 0}, "num_train_timesteps"),
        ("euler", {"trained_betas": [0.1, 0.2]}, "trained_betas"),
        ("dpmpp_2m", {"solver_type": "heun"}, "solver_type"),
        ("euler", {"interpolation_type": "log_linear"}, "interpolation_type"),
        ("euler", {"beta_start": "abc"}, "beta_start"),
        ("euler", {"beta_end": float("nan")}, "beta_end"),
        ("euler", {"steps_offset": 1.5}, "steps_offset"),
        ("ddim", {"clip_sample": "yes"}, "clip_sample"),
        ("euler", {"trained_betas": ["x"] * 1000}, "trained_betas"),
        ("euler", {"num_train_timesteps": True}, "num_train_timesteps"),
        ("lcm", {"original_inference_steps": None}, "original_inference_steps"),
    ],
)
def test_bad_config_is_an_option_error(name: str, config_change: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        create_scheduler(name, config={**SD15_CONFIG, **config_change})


def test_config_and_schedule_types_are_checked() -> None:
    with pytest.raises(OptionError, match="must be a dict"):
        create_scheduler("euler", config=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(UnknownSchedulerError):
        create_scheduler("euler", schedule=5)  # type: ignore[arg-type]
    assert (
        create_scheduler("euler", config={**SD15_CONFIG, "num_train_timesteps": 1000.0}).config.num_train_timesteps
        == 1000
    )


@pytest.mark.parametrize(("steps", "strength"), [(0, 1.0), (1001, 1.0), (True, 1.0), (2.5, 1.0), (10, 1.5), (10, 0.0)])
def test_bad_set_timesteps_is_an_input_error(steps: Any, strength: float) -> None:
    with pytest.raises(InputError):
        create_scheduler("euler").set_timesteps(steps, strength=strength)


def test_lcm_step_limit() -> None:
    with pytest.raises(InputError, match="at most 50"):
        create_scheduler("lcm").set_timesteps(60)


def test_misuse_of_step_is_an_input_error() -> None:
    sched = create_scheduler("euler_a")
    x = np.zeros(SHAPE, np.float32)
    with pytest.raises(InputError, match="set_timesteps"):
        sched.step(x, 999, x)
    sched.set_timesteps(2)
    first, second = sched.timesteps
    with pytest.raises(InputError, match="not the next one"):
        sched.step(x, second, x, noise=noise_from_seed(0))
    with pytest.raises(InputError, match="noise="):
        sched.step(x, first, x)
    with pytest.raises(InputError, match="shape"):
        sched.step(np.zeros((1, 4, 2, 2), np.float32), first, x, noise=noise_from_seed(0))
    with pytest.raises(InputError, match="noise callable returned shape"):
        sched.step(x, first, x, noise=lambda shape: np.zeros((1,), np.float32))
    with pytest.raises(InputError, match="float array"):
        sched.step("not an array", first, x, noise=noise_from_seed(0))  # type: ignore[arg-type]
    sched.set_timesteps(2)
    for t in sched.timesteps:
        x = sched.step(x, t, x, noise=noise_from_seed(0))
    with pytest.raises(InputError, match="done"):
        sched.step(x, second, x, noise=noise_from_seed(0))
    with pytest.raises(InputError, match="not one of"):
        sched.add_noise(x, x, 12345)


def test_schedules_constant_lists_them_all() -> None:
    assert SCHEDULES[:7] == ("normal", "karras", "exponential", "sgm_uniform", "simple", "ddim_uniform", "beta")
    assert set(SCHEDULES[7:]) == {
        "align_your_steps",
        "align_your_steps_sdxl",
        "align_your_steps_svd",
        "kl_optimal",
        "linear_quadratic",
    }
    assert set(BUILTINS) <= set(scheduler_names())


@pytest.mark.parametrize("name", ["heun", "dpmpp_sde", "uni_pc", "uni_pc_bh2", "deis", "ipndm_v"])
def test_two_stage_samplers_do_not_alias_the_callers_array(name: str) -> None:
    def run(reuse: bool) -> np.ndarray:
        sched = create_scheduler(name)
        sched.set_timesteps(3)
        draw = noise_from_seed(2)
        x = noise_from_seed(1)(SHAPE) * sched.init_noise_sigma
        for t in sched.timesteps:
            out = _fake_model(sched.scale_model_input(x, t), t)
            new = sched.step(out, t, x, noise=draw)
            if reuse:
                x[...] = new  # a pipeline writing into its latents buffer in place
            else:
                x = new
        return x

    np.testing.assert_array_equal(run(reuse=True), run(reuse=False))
