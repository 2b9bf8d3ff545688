"""Sampler/schedule names as A1111, ComfyUI and diffusers users type them."""

from __future__ import annotations

import pytest

from sdkit.errors import OptionError, SdkitError, UnknownSchedulerError
from sdkit.schedulers import create_scheduler, resolve, resolve_schedule, scheduler_names

BUILTINS = ["euler", "euler_a", "heun", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde", "ddim", "lcm"]


def test_builtins_are_registered_in_order() -> None:
    assert scheduler_names()[: len(BUILTINS)] == BUILTINS


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        # canonical and ComfyUI sampler names
        ("euler", ("euler", "normal")),
        ("euler_ancestral", ("euler_a", "normal")),
        ("heun", ("heun", "normal")),
        ("dpmpp_2m", ("dpmpp_2m", "normal")),
        ("dpmpp_2m_sde", ("dpmpp_2m_sde", "normal")),
        ("dpmpp_sde", ("dpmpp_sde", "normal")),
        ("ddim", ("ddim", "normal")),
        ("lcm", ("lcm", "normal")),
        # A1111 display names and internal k_ names
        ("Euler a", ("euler_a", "normal")),
        ("Euler", ("euler", "normal")),
        ("k_euler", ("euler", "normal")),
        ("k_euler_a", ("euler_a", "normal")),
        ("Heun", ("heun", "normal")),
        ("DPM++ 2M", ("dpmpp_2m", "normal")),
        ("dpm++ 2m", ("dpmpp_2m", "normal")),
        ("dpm++_2m", ("dpmpp_2m", "normal")),
        ("k_dpmpp_2m", ("dpmpp_2m", "normal")),
        ("DPM++ 2M SDE", ("dpmpp_2m_sde", "normal")),
        ("DPM++ SDE", ("dpmpp_sde", "normal")),
        ("DDIM", ("ddim", "normal")),
        ("LCM", ("lcm", "normal")),
        ("  euler-a  ", ("euler_a", "normal")),
        # A1111 "<sampler> <schedule>" names
        ("DPM++ 2M Karras", ("dpmpp_2m", "karras")),
        ("DPM++ SDE Karras", ("dpmpp_sde", "karras")),
        ("DPM++ 2M SDE Karras", ("dpmpp_2m_sde", "karras")),
        ("DPM++ 2M SDE Exponential", ("dpmpp_2m_sde", "exponential")),
        ("dpmpp_2m_karras", ("dpmpp_2m", "karras")),
        ("Euler SGM Uniform", ("euler", "sgm_uniform")),
        ("k_dpmpp_2m_sde_karras", ("dpmpp_2m_sde", "karras")),
    ],
)
def test_resolve(typed: str, expected: tuple[str, str]) -> None:
    assert resolve(typed) == expected


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("normal", "normal"),
        ("Uniform", "normal"),
        ("Karras", "karras"),
        ("exponential", "exponential"),
        ("SGM Uniform", "sgm_uniform"),
        ("sgm_uniform", "sgm_uniform"),
    ],
)
def test_resolve_schedule(typed: str, expected: str) -> None:
    assert resolve_schedule(typed) == expected
    assert resolve("euler", typed) == ("euler", expected)


def test_explicit_schedule_agrees_with_suffix() -> None:
    assert resolve("DPM++ 2M Karras", "karras") == ("dpmpp_2m", "karras")
    with pytest.raises(OptionError, match="karras"):
        resolve("DPM++ 2M Karras", "exponential")


def test_unknown_sampler_suggests_a_name() -> None:
    with pytest.raises(
        UnknownSchedulerError, match=r"^unknown sampler 'DPM\+\+ 2N' \(did you mean 'DPM\+\+ 2M'"
    ) as info:
        resolve("DPM++ 2N")
    assert isinstance(info.value, SdkitError)
    with pytest.raises(UnknownSchedulerError, match="did you mean 'euler'"):
        create_scheduler("eulr")
    with pytest.raises(UnknownSchedulerError):
        resolve("")


def test_unknown_schedule_suggests_a_name() -> None:
    with pytest.raises(UnknownSchedulerError, match=r"^unknown schedule 'karas' \(did you mean 'karras'"):
        resolve("euler", "karas")


def test_stable_diffusion_cpp_names_resolve() -> None:
    """stable-diffusion.cpp's --sampling-method and --scheduler spellings."""
    assert resolve("dpm++2m") == ("dpmpp_2m", "normal")
    assert resolve("euler_a", "discrete") == ("euler_a", "normal")
    assert resolve("euler", "karras") == ("euler", "karras")


def test_create_scheduler_uses_the_suffix() -> None:
    sched = create_scheduler("DPM++ 2M Karras")
    assert (sched.name, sched.schedule) == ("dpmpp_2m", "karras")
    assert create_scheduler("Euler a").schedule == "normal"


@pytest.mark.parametrize("name", ["tcd", "TCD Karras"])
def test_unsupported_schedule_is_an_option_error(name: str) -> None:
    # ddim and lcm take karras through their sigma-schedule variants (test_k_solvers); tcd has none
    with pytest.raises(OptionError, match="does not support schedule 'karras'"):
        create_scheduler(name, "karras")
