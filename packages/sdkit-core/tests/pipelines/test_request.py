"""GenerationRequest: checked once, without a model, naming the field; the same object runs
through generate(), run() and the CLI; PNG labels from the scheduler classes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import sdkit
from sdkit.cli.main import main
from sdkit.errors import InputError, OptionError, UnknownSchedulerError
from sdkit.pipelines import GenerationParameters, GenerationRequest
from sdkit.schedulers import sampler_label, schedule_label, scheduler_class, scheduler_names

# What the PNG "parameters" text said for each sampler and schedule before the labels moved onto
# the scheduler classes (images.SAMPLER_LABELS / SCHEDULE_LABELS at commit af0e26f).
BEFORE_SAMPLERS = {
    "euler": "Euler",
    "euler_a": "Euler a",
    "heun": "Heun",
    "dpmpp_2m": "DPM++ 2M",
    "dpmpp_2m_sde": "DPM++ 2M SDE",
    "dpmpp_sde": "DPM++ SDE",
    "ddim": "DDIM",
    "lcm": "LCM",
    "euler_flow": "Euler",  # flow matching (SD3, Flux): A1111/Forge write "Euler"
    # sdkit.schedulers.k_solvers, and their flow variants under the same labels
    "dpm_2": "DPM2",
    "dpm_2_a": "DPM2 a",
    "dpmpp_2s_a": "DPM++ 2S a",
    "dpmpp_3m_sde": "DPM++ 3M SDE",
    "lms": "LMS",
    "ddpm": "DDPM",
    "ddim_sigmas": "DDIM",  # ComfyUI's ddim / lcm on sigma schedules ("DDIM Karras")
    "lcm_sigmas": "LCM",
    "heunpp2": "Heun++ 2",
    "euler_cfg_pp": "Euler CFG++",
    "dpmpp_2m_cfg_pp": "DPM++ 2M CFG++",
    "restart": "Restart",
    "euler_a_flow": "Euler a",
    "heun_flow": "Heun",
    "dpmpp_2m_flow": "DPM++ 2M",
    "dpmpp_2s_a_flow": "DPM++ 2S a",
    "lms_flow": "LMS",
    "dpm_2_flow": "DPM2",
    "dpm_2_a_flow": "DPM2 a",
    "heunpp2_flow": "Heun++ 2",
    "euler_cfg_pp_flow": "Euler CFG++",
}
# issue 27: UniPC, DEIS, iPNDM, TCD and their flow variants (A1111's "UniPC"; the others ComfyUI's)
BEFORE_SAMPLERS.update(
    {
        "uni_pc": "UniPC",
        "uni_pc_bh2": "UniPC bh2",
        "deis": "DEIS",
        "ipndm": "iPNDM",
        "ipndm_v": "iPNDM_v",
        "tcd": "TCD",
        "uni_pc_flow": "UniPC",
        "uni_pc_bh2_flow": "UniPC bh2",
        "deis_flow": "DEIS",
        "ipndm_flow": "iPNDM",
        "ipndm_v_flow": "iPNDM_v",
        # ComfyUI's DPM++ 2M/3M SDE (half log-SNR), DDPM and DPM++ 2M CFG++ on flow models
        "dpmpp_2m_sde_flow": "DPM++ 2M SDE",
        "dpmpp_3m_sde_flow": "DPM++ 3M SDE",
        "ddpm_flow": "DDPM",
        "dpmpp_2m_cfg_pp_flow": "DPM++ 2M CFG++",
        # ComfyUI's DPM++ SDE (half log-SNR), ddim (Euler) and lcm (CONST noise scaling) on flow models
        "dpmpp_sde_flow": "DPM++ SDE",
        "ddim_flow": "DDIM",
        "lcm_flow": "LCM",
    }
)
BEFORE_SCHEDULES = {
    "normal": "Automatic",
    "karras": "Karras",
    "exponential": "Exponential",
    "sgm_uniform": "SGM Uniform",
}


def test_create_resolves_and_checks_without_a_model() -> None:
    request = GenerationRequest.create("a cat", sampler="DPM++ 2M Karras", steps=25, seed=3, width=64)
    assert (request.sampler, request.schedule) == ("dpmpp_2m", "karras")
    assert (request.steps, request.seed, request.width, request.height) == (25, 3, 64, None)
    assert not request.img2img
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.steps = 2  # type: ignore[misc]
    drawn = {GenerationRequest.create("a cat").seed for _ in range(4)}
    assert len(drawn) > 1  # no seed: a random one, fixed in the request


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"width": 30}, InputError, "width must be a multiple of 8"),
        ({"height": 4}, InputError, "height must be an integer >= 8"),
        ({"steps": 1.5}, InputError, "steps must be an integer"),
        ({"num_images": 0}, InputError, "num_images"),
        ({"guidance_scale": "x"}, InputError, "guidance_scale must be a number"),
        ({"seed": "1"}, InputError, "seed must be an integer"),
        ({"sampler": "eulr_a"}, UnknownSchedulerError, "did you mean"),
        ({"sampler": "tcd", "schedule": "karras"}, OptionError, "does not support schedule 'karras'"),
        ({"sampler": "Euler Karras", "schedule": "exponential"}, OptionError, "names schedule 'karras'"),
        ({"init_image": "/no/such.png"}, InputError, "init image not found"),
        ({"init_image": np.zeros((8, 8, 3), np.uint8), "strength": 0.0}, InputError, "strength must be in"),
        ({"negative_prompt": 3}, InputError, "negative_prompt must be a string"),
        ({"callback": "print"}, InputError, "callback must be callable"),
        ({"output_type": "tensor"}, InputError, "output_type"),
        ({"stpes": 3}, OptionError, "did you mean 'steps'"),
    ],
)
def test_bad_fields_are_named(fields: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        GenerationRequest.create("a cat", **fields)


def test_replace_checks_again() -> None:
    request = GenerationRequest.create("a cat", seed=1, sampler="Euler a")
    changed = request.replace(sampler="DPM++ 2M SDE Exponential", steps=4)
    assert (changed.sampler, changed.schedule, changed.steps, changed.seed) == ("dpmpp_2m_sde", "exponential", 4, 1)
    assert request.steps == 20
    with pytest.raises(InputError, match="width"):
        request.replace(width=12)


def test_a_subclass_adds_fields_the_documented_way() -> None:
    @dataclasses.dataclass(frozen=True, eq=False)
    class WithClipSkip(GenerationRequest):
        clip_skip: int = 1

        @classmethod
        def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
            values = super().checked(values)
            if "clip_skip" in values:
                from sdkit.pipelines.request import as_int

                values["clip_skip"] = as_int(values["clip_skip"], "clip_skip", 1)
            return values

    assert WithClipSkip.create("a cat", clip_skip=2, sampler="Euler").clip_skip == 2
    with pytest.raises(InputError, match="clip_skip"):
        WithClipSkip.create("a cat", clip_skip=0)


def test_generate_with_keywords_or_a_request_is_the_same(reference_pipe: Any) -> None:
    kwargs = {"seed": 4, "width": 32, "height": 32, "steps": 1, "guidance_scale": 1.0, "output_type": "np"}
    by_keywords = reference_pipe.generate("a red cat", **kwargs)
    request = GenerationRequest.create("a red cat", **kwargs)
    np.testing.assert_array_equal(reference_pipe.generate(request), by_keywords)
    np.testing.assert_array_equal(reference_pipe.run(request), by_keywords)
    with pytest.raises(OptionError, match="not both"):
        reference_pipe.generate(request, steps=2)


def test_the_sampler_is_resolved_once_per_request(reference_pipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sdkit.pipelines.request as request_module

    calls: list[str] = []
    real = request_module.resolve

    def counting(sampler: str, schedule: str | None = None, registry: Any = None) -> tuple[str, str]:
        calls.append(sampler)
        return real(sampler, schedule, registry)

    monkeypatch.setattr(request_module, "resolve", counting)
    monkeypatch.setattr("sdkit.schedulers.names.resolve", counting)
    reference_pipe.generate("a cat", sampler="Euler a", seed=0, width=32, height=32, steps=1, output_type="np")
    assert calls == ["Euler a"]


def test_model_dependent_checks_happen_against_the_config(reference_pipe: Any) -> None:
    config = reference_pipe.config
    assert config.size_multiple == 8 and config.default_size == 64
    with pytest.raises(InputError, match=r"steps must be in 1\.\.1000"):  # the scheduler config's range
        reference_pipe.generate("a cat", steps=1001, width=32, height=32, output_type="np")
    request = GenerationRequest.create("a cat", latents=np.zeros((1, 4, 4, 4), np.float32), width=32, height=32)
    with pytest.raises(InputError, match=r"latents must be float32 \[1, 4, 16, 16\]"):
        reference_pipe.run(request)


def test_the_cli_builds_one_request_before_loading_and_runs_it(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[GenerationRequest] = []
    ran: list[GenerationRequest] = []
    real_create = GenerationRequest.create.__func__  # type: ignore[attr-defined]
    real_run = sdkit.pipelines.StableDiffusionPipeline.run

    def create(cls: type[GenerationRequest], prompt: str, **fields: Any) -> GenerationRequest:
        created.append(real_create(cls, prompt, **fields))
        return created[-1]

    def run(self: Any, request: GenerationRequest) -> Any:
        ran.append(request)
        return real_run(self, request)

    monkeypatch.setattr(GenerationRequest, "create", classmethod(create))
    monkeypatch.setattr(sdkit.pipelines.StableDiffusionPipeline, "run", run)
    out = tmp_path / "cat.png"
    argv = ["generate", "a cat", "--model", str(tiny_dir), "-o", str(out), "--steps", "1", "--seed", "2"]
    assert main([*argv, "--width", "32", "--height", "32", "--backend", "reference"]) == 0
    assert len(created) == 1 and ran == created
    assert out.is_file()


@pytest.mark.parametrize("sampler", sorted(BEFORE_SAMPLERS))
def test_png_parameters_are_byte_identical_for_todays_samplers(sampler: str) -> None:
    assert sampler in scheduler_names()
    for schedule in set(scheduler_class(sampler).schedules) & set(BEFORE_SCHEDULES):
        params = GenerationParameters("a cat", "ugly", 20, sampler, schedule, 7.0, 1, 64, 64, "tiny", 0.5)
        assert params.a1111_text() == (
            "a cat\nNegative prompt: ugly\n"
            f"Steps: 20, Sampler: {BEFORE_SAMPLERS[sampler]}, Schedule type: {BEFORE_SCHEDULES[schedule]}, "
            "CFG scale: 7, Seed: 1, Size: 64x64, Model: tiny, Denoising strength: 0.5, Software: sdkit"
        )


def test_every_registered_builtin_sampler_has_a_label() -> None:
    assert set(scheduler_names()) == set(BEFORE_SAMPLERS)  # a new sampler: add its label above
    for name in scheduler_names():
        assert scheduler_class(name).label == sampler_label(name) == BEFORE_SAMPLERS[name]
    assert schedule_label("karras") == "Karras"
    # ComfyUI's schedules, under the names A1111's "Schedule type" menu gives them.
    assert (schedule_label("simple"), schedule_label("beta"), schedule_label("ddim_uniform")) == (
        "Simple",
        "Beta",
        "DDIM",
    )


@pytest.mark.parametrize(
    ("fields", "sampler", "schedule", "label"),
    [
        ({"sampler": "DDIM Karras"}, "ddim_sigmas", "karras", "Sampler: DDIM, Schedule type: Karras"),
        ({"sampler": "ddim", "schedule": "beta"}, "ddim_sigmas", "beta", "Sampler: DDIM, Schedule type: Beta"),
        (
            {"sampler": "LCM", "schedule": "Exponential"},
            "lcm_sigmas",
            "exponential",
            "Sampler: LCM, Schedule type: Exponential",
        ),
        ({"sampler": "DDIM"}, "ddim", "normal", "Sampler: DDIM, Schedule type: Automatic"),
    ],
)
def test_ddim_and_lcm_with_a_sigma_schedule(fields: dict[str, Any], sampler: str, schedule: str, label: str) -> None:
    request = GenerationRequest.create("a cat", **fields)
    assert (request.sampler, request.schedule) == (sampler, schedule)
    params = GenerationParameters("a cat", "", 20, sampler, schedule, 7.0, 1, 64, 64, "tiny", None)
    assert label in params.a1111_text()


def test_label_fallback_for_third_party_schedulers() -> None:
    from sdkit.plugins import SchedulerRegistry
    from sdkit.schedulers.k_samplers import Euler

    class WithAliases(Euler):
        name: ClassVar[str] = "my_sampler"
        aliases: ClassVar[tuple[str, ...]] = ("My Sampler", "mine")
        label: ClassVar[str] = ""

    class Bare(Euler):
        name: ClassVar[str] = "bare_sampler"
        aliases: ClassVar[tuple[str, ...]] = ()
        label: ClassVar[str] = ""

    registry = SchedulerRegistry()
    registry.add(WithAliases)
    registry.add(Bare)
    assert sampler_label("my_sampler", registry) == "My Sampler"  # the first alias
    assert sampler_label("bare_sampler", registry) == "bare_sampler"  # else the name
    assert sampler_label("Restart", registry) == "Restart"  # not registered: as written
