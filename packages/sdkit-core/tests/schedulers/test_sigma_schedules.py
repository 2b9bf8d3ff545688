"""Align Your Steps, KL Optimal and Linear-Quadratic (sdkit.schedulers.sigma_schedules): the worked
examples of its docstring (hand-computed from the published tables and ComfyUI's / A1111's
formulas) and independent properties, then the schedules as the samplers use them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sdkit.errors import OptionError
from sdkit.schedulers import SCHEDULES, create_scheduler
from sdkit.schedulers.sigma_schedules import (
    AYS_TABLES,
    ays_sigmas,
    computed_sigmas,
    kl_optimal_sigmas,
    linear_quadratic_sigmas,
    loglinear_interp,
)

# NVIDIA's how-to page (https://research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html)
PUBLISHED = {
    "sd15": [14.615, 6.475, 3.861, 2.697, 1.886, 1.396, 0.963, 0.652, 0.399, 0.152, 0.029],
    "sdxl": [14.615, 6.315, 3.771, 2.181, 1.342, 0.862, 0.555, 0.380, 0.234, 0.113, 0.029],
    "svd": [700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002],
}


def test_ays_tables_are_the_published_ones() -> None:
    assert {k: list(v) for k, v in AYS_TABLES.items()} == PUBLISHED


def test_ays_worked_examples() -> None:
    # 11 steps: the table itself; 6 steps: every other table point, exactly.
    np.testing.assert_array_equal(ays_sigmas("sd15", 11), PUBLISHED["sd15"])
    np.testing.assert_allclose(ays_sigmas("sd15", 6), [14.615, 3.861, 1.886, 0.963, 0.399, 0.029], rtol=1e-12)
    # 5 steps: positions 0, 2.5, 5, 7.5, 10 -> geometric means of the neighbours at 2.5 and 7.5.
    five = ays_sigmas("sd15", 5)
    np.testing.assert_allclose(five, [14.615, math.sqrt(3.861 * 2.697), 1.396, math.sqrt(0.652 * 0.399), 0.029])
    assert abs(five[1] - 3.2269362) < 1e-6 and abs(five[3] - 0.5100471) < 1e-6


@pytest.mark.parametrize("steps", [2, 3, 7, 10, 12, 25, 40])
@pytest.mark.parametrize("table", ["sd15", "sdxl", "svd"])
def test_ays_interpolation_properties(table: str, steps: int) -> None:
    sigmas = ays_sigmas(table, steps)
    assert len(sigmas) == steps
    assert sigmas[0] == pytest.approx(PUBLISHED[table][0]) and sigmas[-1] == pytest.approx(PUBLISHED[table][-1])
    assert np.all(np.diff(sigmas) < 0)
    # log-linear: every point's log lies on the segment between its two table neighbours
    log_table = np.log(PUBLISHED[table][::-1])
    positions = np.linspace(0, 10, steps)[::-1]
    for sigma, pos in zip(sigmas, positions, strict=True):
        low = int(min(math.floor(pos), 9))
        expected = log_table[low] + (pos - low) * (log_table[low + 1] - log_table[low])
        assert math.log(sigma) == pytest.approx(expected, abs=1e-12)


def test_loglinear_interp_of_a_geometric_sequence_is_geometric() -> None:
    table = 10.0 * 0.5 ** np.arange(5)
    np.testing.assert_allclose(loglinear_interp(table, 9), 10.0 * 0.5 ** (np.arange(9) / 2), rtol=1e-12)


def test_kl_optimal_worked_example_and_property() -> None:
    np.testing.assert_allclose(kl_optimal_sigmas(0.1, 10.0, 3), [10.0, 1.0, 0.1], rtol=1e-12)
    sigmas = kl_optimal_sigmas(0.0292, 14.6146, 9)
    steps = np.diff(np.arctan(sigmas))
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)  # evenly spaced in atan(sigma)
    assert kl_optimal_sigmas(0.0292, 14.6146, 1).tolist() == [14.6146]


def test_linear_quadratic_worked_example_and_properties() -> None:
    np.testing.assert_allclose(linear_quadratic_sigmas(1.0, 4), [1.0, 0.9875, 0.975, 0.725], rtol=1e-12)
    for steps in (2, 5, 8, 13, 30):
        fractions = 1 - linear_quadratic_sigmas(1.0, steps)
        half = steps // 2
        np.testing.assert_allclose(np.diff(fractions[: half + 1]), 0.025 / half, rtol=1e-9)  # linear part
        assert fractions[half] == pytest.approx(0.025)  # reaches the threshold where the quadratic starts
        # the quadratic continues to 1 at i = steps (the final 0 sigma) with a continuous slope
        quad = np.polyfit(np.arange(half, steps), fractions[half:], 2) if steps - half >= 3 else None
        if quad is not None:
            assert np.polyval(quad, steps) == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(linear_quadratic_sigmas(14.6, 4), 14.6 * np.array([1.0, 0.9875, 0.975, 0.725]))


def test_unknown_computed_schedule() -> None:
    with pytest.raises(OptionError, match="kl_optimal"):
        computed_sigmas("nope", 4, 0.1, 10.0)


@pytest.mark.parametrize("sampler", ["euler", "euler_a", "heun", "dpmpp_2m", "dpmpp_sde", "uni_pc", "deis", "ipndm"])
@pytest.mark.parametrize(
    ("schedule", "first"),
    [("align_your_steps", [14.615, 3.861, 1.886]), ("align_your_steps_sdxl", [14.615, 3.771, 1.342])],
)
def test_samplers_run_align_your_steps(sampler: str, schedule: str, first: list[float]) -> None:
    sched = create_scheduler(sampler, schedule=schedule)
    sched.set_timesteps(6)
    distinct = list(dict.fromkeys(np.asarray(sched.sigmas, dtype=np.float64).round(6)))
    np.testing.assert_allclose(distinct[:3], first, rtol=1e-6)
    assert distinct[-1] == 0.0 and len(distinct) == 7  # six sigmas, then 0
    # each sigma's timestep is where the training table has it (log-sigma interpolation)
    assert float(sched.timesteps[0]) == pytest.approx(999, abs=0.5)


@pytest.mark.parametrize("schedule", ["kl_optimal", "linear_quadratic"])
def test_kl_and_linear_quadratic_span_the_training_table(schedule: str) -> None:
    sched = create_scheduler("euler", schedule=schedule)
    sched.set_timesteps(5)
    train = np.sqrt((1 - sched.alphas_cumprod) / sched.alphas_cumprod)
    expected = computed_sigmas(schedule, 5, float(train[0]), float(train[-1]))
    np.testing.assert_allclose(sched.sigmas[:-1], expected, rtol=1e-6)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s not in ("normal", "sgm_uniform")])
def test_ddim_and_lcm_take_every_sigma_schedule(schedule: str) -> None:
    """As ComfyUI runs its ddim and lcm: on the sigmas every k-sampler gets (Euler's here)."""
    euler = create_scheduler("euler", schedule=schedule)
    euler.set_timesteps(6)
    for sampler in ("ddim", "lcm"):
        sched = create_scheduler(sampler, schedule=schedule)
        sched.set_timesteps(6)
        assert sched.name == f"{sampler}_sigmas"
        np.testing.assert_array_equal(sched.sigmas, euler.sigmas)
    with pytest.raises(OptionError, match="does not support schedule"):
        create_scheduler("tcd", schedule=schedule)


@pytest.mark.parametrize("sampler", ["Euler", "UniPC", "ipndm"])
def test_flow_kl_optimal_and_linear_quadratic_use_comfyui_flow_table_ends(sampler: str) -> None:
    """On a flow model the two formulas span ComfyUI's shifted flow table: sigma_min = shift(1/N)
    (SD3: N = 1000, shift 3 -> 3 * 0.001 / (1 + 2 * 0.001); Flux dev: N = 10000, mu), sigma_max = 1."""
    sd3 = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}
    sched = create_scheduler(sampler, schedule="kl_optimal", config=sd3)
    sched.set_timesteps(5)
    expected = kl_optimal_sigmas(3 * 0.001 / (1 + 2 * 0.001), 1.0, 5)
    expected[0] = min(expected[0], 1.0 - (1e-6 if sampler == "UniPC" else 0.0))  # UniPC's first-sigma offset
    np.testing.assert_allclose(sched.sigmas, [*expected, 0.0], rtol=1e-6)
    flux = {"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True, "shift": 3.0}
    sched = create_scheduler(sampler, schedule="linear_quadratic", config=flux)
    sched.set_timesteps(4, mu=0.8)
    expected = linear_quadratic_sigmas(1.0, 4)
    expected[0] = min(expected[0], 1.0 - (1e-6 if sampler == "UniPC" else 0.0))
    np.testing.assert_allclose(sched.sigmas, [*expected, 0.0], rtol=1e-6)
    np.testing.assert_allclose(sched.timesteps, np.float32(sched.sigmas[:-1]) * 1000, rtol=1e-6)
