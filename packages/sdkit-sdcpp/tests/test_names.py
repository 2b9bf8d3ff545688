"""sdkit's sampler and schedule names <-> stable-diffusion.cpp's, both ways; what has no
counterpart is refused by name. sd.cpp's own names are checked against the binding's tables
where it is installed."""

from __future__ import annotations

import pytest
from sdcpp_helpers import needs_binding

from sdkit.errors import OptionError
from sdkit.pipelines import GenerationRequest
from sdkit.schedulers.names import scheduler_names
from sdkit_sdcpp.names import SAMPLERS, SCHEDULES, SDCPP_SAMPLERS, SDCPP_SCHEDULES, from_sdcpp, to_sdcpp


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("Euler a", ("euler_a", "default")),
        ("DPM++ 2M Karras", ("dpm++2m", "karras")),
        ("euler_exponential", ("euler", "exponential")),
        ("Heun SGM Uniform", ("heun", "sgm_uniform")),
        ("DDIM", ("ddim_trailing", "default")),
        ("LCM", ("lcm", "default")),
    ],
)
def test_what_users_type_reaches_sdcpp(user: str, expected: tuple[str, str]) -> None:
    request = GenerationRequest.create("x", sampler=user)
    assert to_sdcpp(request.sampler, request.schedule) == expected


def test_every_registered_sampler_maps_or_is_refused_by_name() -> None:
    for name in scheduler_names():
        if name in SAMPLERS:
            assert to_sdcpp(name, "normal")[0] in SDCPP_SAMPLERS
        else:
            with pytest.raises(OptionError, match=f"sampler {name!r}: stable-diffusion.cpp has no such sampler"):
                to_sdcpp(name, "normal")


@pytest.mark.parametrize("schedule", ["beta", "ddim_uniform"])
def test_schedules_without_counterpart_are_refused(schedule: str) -> None:
    with pytest.raises(OptionError, match=f"schedule {schedule!r}"):
        to_sdcpp("euler", schedule)


def test_round_trip() -> None:
    for sampler in SDCPP_SAMPLERS.values():
        for schedule in SCHEDULES:
            assert from_sdcpp(*to_sdcpp(sampler, schedule)) == (sampler, schedule)
    assert from_sdcpp("dpm++2m", "discrete") == ("dpmpp_2m", "normal")
    with pytest.raises(OptionError, match="'ipndm' has no sdkit counterpart"):
        from_sdcpp("ipndm")


@needs_binding
def test_names_are_the_bindings() -> None:
    from stable_diffusion_cpp.stable_diffusion import SAMPLE_METHOD_MAP, SCHEDULER_MAP

    assert set(SDCPP_SAMPLERS) <= set(SAMPLE_METHOD_MAP)
    assert set(SDCPP_SCHEDULES) <= set(SCHEDULER_MAP)
