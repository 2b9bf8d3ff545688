"""Issue 27's samplers beyond the diffusers replays: iPNDM_v (ComfyUI-only) against its written-down
algorithm and independent properties, names from A1111 / ComfyUI / stable-diffusion.cpp, options,
flow variants and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate

from sdkit.errors import OptionError, UnknownSchedulerError
from sdkit.schedulers import create_scheduler, noise_from_seed, resolve, sampler_label, scheduler_class
from sdkit.schedulers.ipndm import FIXED_WEIGHTS, variable_weights
from sdkit.schedulers.names import SCHEDULE_LABELS, resolve_schedule, schedule_label

FLUX = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}


def lagrange_weights(sigmas: list[float], i: int, order: int) -> list[float]:
    """Adams-Bashforth weights from the Lagrange basis through sigmas i, i-1, ... integrated over
    [sigma_i, sigma_{i+1}] (k-diffusion's linear_multistep_coeff), divided by the step."""
    h = sigmas[i + 1] - sigmas[i]
    out = []
    for j in range(order):

        def basis(tau: float, j: int = j) -> float:
            value = 1.0
            for k in range(order):
                if k != j:
                    value *= (tau - sigmas[i - k]) / (sigmas[i - j] - sigmas[i - k])
            return value

        out.append(integrate.quad(basis, sigmas[i], sigmas[i + 1], epsabs=1e-14, epsrel=1e-13)[0] / h)
    return out


def test_ipndm_v_worked_example() -> None:
    # sigmas 4, 3, 2, 1, stepping from 2 to 1 with two earlier points: weights 23/12, -16/12, 5/12
    np.testing.assert_allclose(variable_weights([-1.0, -1.0, -1.0]), [23 / 12, -16 / 12, 5 / 12], rtol=1e-15)
    # ComfyUI's fourth-order expression: (57, -64, 41, -10) / 24 on equal steps (not AB4's 55, -59, 37, -9)
    np.testing.assert_allclose(variable_weights([-1.0] * 4), np.array([57, -65, 43, -11]) / 24, rtol=1e-14)


@pytest.mark.parametrize("sigmas", [[14.6, 6.3, 3.7, 2.1, 1.3, 0.8], [1.0, 0.9, 0.7, 0.45, 0.2, 0.1]])
def test_ipndm_v_properties(sigmas: list[float]) -> None:
    for i in range(1, len(sigmas) - 1):
        steps = [sigmas[i + 1] - sigmas[i]] + [sigmas[i - k] - sigmas[i - k - 1] for k in range(min(i, 3))]
        for order in range(1, len(steps) + 1):
            weights = variable_weights(steps[:order])
            if order <= 3:  # exact for a constant derivative
                assert sum(weights) == pytest.approx(1.0, abs=1e-12)
            if order == 2:  # variable-step Adams-Bashforth 2, an independent construction
                np.testing.assert_allclose(weights, lagrange_weights(sigmas, i, 2), rtol=1e-10)


def test_ipndm_v_fourth_order_is_consistent_only_for_geometric_steps() -> None:
    """ComfyUI's fourth-order weights sum to 1 + t2 * ratio * (h2/h3 - h1/h2): 1 when the earlier
    steps shrink geometrically (Karras-like), not otherwise. Kept as ComfyUI computes them."""
    assert sum(variable_weights([-1.0, -2.0, -4.0, -8.0])) == pytest.approx(1.0, abs=1e-12)
    assert sum(variable_weights([-1.0, -1.0, -1.0, -1.0])) == pytest.approx(1.0, abs=1e-12)
    assert abs(sum(variable_weights([-1.0, -2.0, -3.0, -5.0])) - 1.0) > 1e-3


def test_ipndm_fixed_weights_are_adams_bashforth() -> None:
    equal = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0]
    for order in range(1, 5):
        np.testing.assert_allclose(FIXED_WEIGHTS[order - 1], lagrange_weights(equal, 4, order), rtol=1e-10)


@pytest.mark.parametrize("name", ["ipndm", "ipndm_v"])
def test_ipndm_step_by_hand(name: str) -> None:
    """Three steps on a linear "model" recomputed here from the written-down algorithm."""
    sched = create_scheduler(name, schedule="karras")
    sched.set_timesteps(4)
    sig = [float(s) for s in sched.sigmas]
    x = noise_from_seed(0)((1, 2, 2, 2)) * np.float32(sig[0])
    xs, ds = x.astype(np.float64), []
    for i, t in enumerate(sched.timesteps):
        eps = np.float32(0.3) * sched.scale_model_input(x, t) + np.float32(0.1)
        x = sched.step(eps, t, x)
        d = eps.astype(np.float64)  # (x - (x - sigma eps)) / sigma
        if sig[i + 1] == 0:
            expected = xs - sig[i] * d
        else:
            steps = [sig[i + 1] - sig[i]] + [sig[i - k] - sig[i - k - 1] for k in range(len(ds))]
            weights = variable_weights(steps) if name == "ipndm_v" else FIXED_WEIGHTS[len(ds)]
            history = [d, *reversed(ds)]
            expected = xs + (sig[i + 1] - sig[i]) * sum(w * h for w, h in zip(weights, history, strict=True))
        np.testing.assert_allclose(x, expected, rtol=2e-5, atol=2e-5)
        ds, xs = [*ds, d][-3:], x.astype(np.float64)


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("UniPC", ("uni_pc", "normal")),  # A1111
        ("uni_pc", ("uni_pc", "normal")),  # ComfyUI
        ("uni_pc_bh2", ("uni_pc_bh2", "normal")),
        ("UniPC Karras", ("uni_pc", "karras")),
        ("deis", ("deis", "normal")),
        ("DEIS", ("deis", "normal")),
        ("ipndm", ("ipndm", "normal")),  # ComfyUI and stable-diffusion.cpp
        ("ipndm_v", ("ipndm_v", "normal")),
        ("iPNDM_v", ("ipndm_v", "normal")),
        ("tcd", ("tcd", "normal")),
        ("TCD", ("tcd", "normal")),
        ("ddim_trailing", ("ddim", "sgm_uniform")),  # stable-diffusion.cpp --sampling-method
        ("dpm++2m", ("dpmpp_2m", "normal")),  # stable-diffusion.cpp
        ("euler_ancestral", ("euler_a", "normal")),
        ("DPM++ 2M Karras", ("dpmpp_2m", "karras")),
        ("Euler a", ("euler_a", "normal")),
    ],
)
def test_sampler_names(typed: str, expected: tuple[str, str]) -> None:
    assert resolve(typed) == expected


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("Align Your Steps", "align_your_steps"),  # A1111 label
        ("align_your_steps", "align_your_steps"),  # A1111 name
        ("ays", "align_your_steps"),  # stable-diffusion.cpp --scheduler
        ("KL Optimal", "kl_optimal"),
        ("kl_optimal", "kl_optimal"),
        ("linear_quadratic", "linear_quadratic"),  # ComfyUI
        ("Linear Quadratic", "linear_quadratic"),
        ("discrete", "normal"),  # stable-diffusion.cpp
        ("Automatic", "normal"),
        ("sgm_uniform", "sgm_uniform"),
        ("simple", "simple"),
        ("beta", "beta"),
    ],
)
def test_schedule_names(typed: str, expected: str) -> None:
    assert resolve_schedule(typed) == expected


def test_labels_round_trip() -> None:
    """Every sampler's and schedule's A1111 label parses back to it (PNG parameters)."""
    for name in ("uni_pc", "uni_pc_bh2", "deis", "ipndm", "ipndm_v", "tcd"):
        assert resolve(sampler_label(name))[0] == name
    for schedule, label in SCHEDULE_LABELS.items():
        assert schedule_label(schedule) == label
        assert resolve_schedule(label) in (schedule, "align_your_steps")  # the SD 1.5/SDXL/SVD tables share one label
    assert sampler_label("uni_pc") == "UniPC" and schedule_label("kl_optimal") == "KL Optimal"


def test_unknown_names_are_refused_with_the_list() -> None:
    with pytest.raises(UnknownSchedulerError) as info:
        resolve("dpm++2mv2")
    assert "uni_pc" in str(info.value) and "ipndm" in str(info.value)
    with pytest.raises(UnknownSchedulerError, match="schedule"):
        resolve_schedule("gits")


@pytest.mark.parametrize(
    ("name", "flow"),
    [
        ("UniPC", "uni_pc_flow"),
        ("uni_pc_bh2", "uni_pc_bh2_flow"),
        ("deis", "deis_flow"),
        ("ipndm", "ipndm_flow"),
        ("ipndm_v", "ipndm_v_flow"),
        ("Euler", "euler_flow"),
    ],
)
def test_flow_models_get_the_flow_variant(name: str, flow: str) -> None:
    assert scheduler_class(name, prediction_type="flow").name == flow
    sched = create_scheduler(name, schedule="beta", config=FLUX)
    assert sched.name == flow and sched.prediction_type == "flow"
    assert sampler_label(flow) == sampler_label(scheduler_class(name).name)
    sched.set_timesteps(5)
    x = noise_from_seed(3)((1, 4, 2, 2))
    for t in sched.timesteps:
        x = sched.step(np.float32(0.5) * x, t, x)
    assert np.all(np.isfinite(x))


def test_flow_variants_take_flow_schedules_only() -> None:
    with pytest.raises(OptionError, match="does not support schedule"):
        create_scheduler("uni_pc", schedule="align_your_steps", config=FLUX)
    with pytest.raises(OptionError, match="does not run 'flow'"):
        create_scheduler("tcd", config=FLUX)


def test_order_option() -> None:
    assert create_scheduler("uni_pc")._order == 3  # A1111's and ComfyUI's default
    assert create_scheduler("deis", order=2)._order == 2
    for bad in (0, 4, 2.5):
        with pytest.raises(OptionError, match="order"):
            create_scheduler("uni_pc", order=bad)
    with pytest.raises(OptionError, match="no option"):
        create_scheduler("ipndm", order=2)


def test_tcd_eta_zero_draws_no_noise() -> None:
    sched = create_scheduler("tcd", eta=0.0)
    sched.set_timesteps(3)
    assert not sched.draws_noise
    x = noise_from_seed(1)((1, 4, 2, 2))
    for t in sched.timesteps:
        x = sched.step(np.float32(0.2) * x, t, x)  # no noise callable needed
    assert np.all(np.isfinite(x))


@pytest.mark.parametrize(
    ("typed", "schedule", "written"),
    [
        ("UniPC", "Align Your Steps", "Sampler: UniPC, Schedule type: Align Your Steps"),
        ("uni_pc_bh2", "kl_optimal", "Sampler: UniPC bh2, Schedule type: KL Optimal"),
        ("deis", "linear_quadratic", "Sampler: DEIS, Schedule type: Linear Quadratic"),
        ("ipndm_v", "ays", "Sampler: iPNDM_v, Schedule type: Align Your Steps"),
        ("tcd", None, "Sampler: TCD, Schedule type: Automatic"),
    ],
)
def test_png_parameters_write_a1111_labels(typed: str, schedule: str | None, written: str) -> None:
    from sdkit.pipelines.imaging.images import GenerationParameters

    sampler, canonical_schedule = resolve(typed, schedule)
    text = GenerationParameters("p", "", 20, sampler, canonical_schedule, 7.0, 1, 64, 64, "m").a1111_text()
    assert written in text
    assert resolve(sampler_label(sampler), schedule_label(canonical_schedule))[0] == sampler
