"""The A1111 payload -> sdkit mapping, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sdkit.errors import InputError, UnknownSchedulerError
from sdkit_serve.a1111 import (
    IGNORED,
    Img2ImgRequest,
    Inputs,
    Txt2ImgRequest,
    build_info,
    echo_parameters,
    extra_networks,
    ignored_fields,
    plan_generation,
)
from sdkit_serve.config import Limits
from sdkit_serve.extra_networks import Folders
from sdkit_serve.images import decode_image


def plan(payload: dict[str, Any], inputs: Inputs | None = None) -> Any:
    return plan_generation(Txt2ImgRequest(**payload), Limits(), inputs)


def test_honoured_fields_become_generate_arguments() -> None:
    result = plan(
        {
            "prompt": "a dog",
            "negative_prompt": "blurry",
            "seed": 42,
            "sampler_name": "DPM++ 2M",
            "scheduler": "Karras",
            "steps": 12,
            "cfg_scale": 6.5,
            "width": 512,
            "height": 768,
            "batch_size": 2,
            "n_iter": 3,
        }
    )
    assert result.generate == {
        "prompt": "a dog",
        "negative_prompt": "blurry",
        "steps": 12,
        "guidance_scale": 6.5,
        "sampler": "DPM++ 2M",
        "schedule": "karras",  # A1111 labels become sdkit schedule names
        "width": 512,
        "height": 768,
    }
    assert (result.seed, result.batch_size, result.n_iter) == (42, 2, 3)
    assert [result.first_seed(i) for i in range(3)] == [42, 44, 46]  # image i: seed + i, as A1111
    assert result.ignored == {}


def test_a1111_defaults() -> None:
    result = plan({})
    assert result.generate["sampler"] == "Euler"  # sampler_index's default, as A1111's API
    assert result.generate["schedule"] is None  # "Automatic": the sampler's own
    assert result.generate["steps"] == 50 and result.generate["guidance_scale"] == 7.0
    assert result.generate["width"] is None  # the model's native size
    assert 0 <= result.seed < 2**32  # -1: random
    assert plan({"sampler_index": "Euler a"}).generate["sampler"] == "Euler a"
    assert plan({"sampler_name": "Heun", "sampler_index": "Euler a"}).generate["sampler"] == "Heun"


def test_img2img_mapping() -> None:
    image = Image.new("RGB", (64, 64))
    payload = Img2ImgRequest(init_images=["a", "b"], denoising_strength=0.4, mask="m", resize_mode=1)
    result = plan_generation(payload, Limits(), Inputs(init_image=image))  # no decoded mask: plain img2img
    assert result.generate["init_image"] is image and result.generate["strength"] == 0.4
    assert set(result.ignored) == {"init_images", "resize_mode"}
    echoed = echo_parameters(payload)
    assert echoed["init_images"] is None and echoed["mask"] is None
    assert echo_parameters(payload.model_copy(update={"include_init_images": True}))["init_images"] == ["a", "b"]
    # the hires fix is txt2img's: not in img2img's schema (as A1111's), reported when asked for
    hires = plan_generation(Img2ImgRequest(init_images=["a"], enable_hr=True), Limits(), Inputs(init_image=image))
    assert "enable_hr" in hires.ignored and "enable_hr" not in hires.generate
    assert "enable_hr" not in Img2ImgRequest.model_json_schema()["properties"]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"enable_hr": False, "hr_scale": 2, "hr_upscaler": "Latent", "denoising_strength": 0.7}, set()),
        ({"enable_hr": True, "hr_sampler_name": "Heun"}, set()),  # reported by the hires mapping
        ({"restore_faces": False, "tiling": 0, "styles": [], "subseed": -1, "eta": None, "s_noise": 1.0}, set()),
        (
            {"styles": ["cinematic"], "subseed_strength": 0.3},
            {"styles", "subseed_strength"},
        ),
        ({"tiling": 1}, {"tiling"}),  # a number is not taken for False
        ({"save_images": True, "do_not_save_grid": True}, {"save_images"}),
        ({"my_extension": 1}, {"my_extension"}),
    ],
)  # fmt: skip
def test_ignored_fields_are_reported_only_when_they_ask_for_something(
    payload: dict[str, Any], expected: set[str]
) -> None:
    assert set(ignored_fields(Txt2ImgRequest(**payload), "txt2img")) == expected


def test_every_ignored_field_has_a_reason() -> None:
    assert all(reason for _, reason in IGNORED.values())
    assert not set(IGNORED) & set(Img2ImgRequest.model_fields) - {"denoising_strength", "resize_mode"}


def test_extra_network_tags(tmp_path: Path) -> None:
    prompt, tags, others = extra_networks(
        "a cat <lora:film_grain:0.6>, <lora:detail> <hypernet:h:1> <x:y> <lyco:x:0.5>"
    )
    assert prompt == "a cat <lora:film_grain:0.6>, <lora:detail> <hypernet:h:1>  <lyco:x:0.5>"  # unknown kinds removed
    assert [t.kind for t in tags] == ["lora", "lora", "hypernet", "x", "lyco"]
    assert others == ["<hypernet:h:1>", "<x:y>"]
    (tmp_path / "a.safetensors").write_bytes(b"")
    inputs = Inputs(folders=Folders(lora_dir=tmp_path))
    result = plan({"prompt": "x <lora:a:0.5>", "negative_prompt": "<lora:b:-1>"}, inputs=inputs)
    assert result.generate["prompt"] == "x <lora:a:0.5>" and result.loras == [(tmp_path / "a.safetensors", 0.5)]
    assert "from the prompt" in result.ignored["negative prompt <lora:b:-1>"]
    assert plan({"prompt": "<lora:a>", "disable_extra_networks": True}, inputs=inputs).loras == []
    with pytest.raises(InputError, match="no LoRA folder"):
        plan({"prompt": "<lora:a:1>"})


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("<lora:a:strong>", "the strength must be a number"),
        ("<lora:a:nan>", "finite"),
        ("<lora:a:inf>", "finite"),
        ("<lora:a:-Infinity>", "finite"),
        ("<lora:../outside:1>", "no ../outside.safetensors"),
        ("<lora:/etc/outside:1>", "no /etc/outside.safetensors"),
        ("<lora:linked:1>", "no linked.safetensors"),
        ("<lora:*:1>", r"no \*.safetensors"),
    ],
)
def test_lora_tags_stay_in_their_folder_and_finite(tmp_path: Path, tag: str, message: str) -> None:
    """Issue 30 item 5: a tag is a file of --lora-dir (no ../, absolute path, link out or glob)
    with a finite strength, or a 400."""
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"")
    (tmp_path / "outside.safetensors").write_bytes(b"")
    (folder / "linked.safetensors").symlink_to(tmp_path / "outside.safetensors")
    with pytest.raises(InputError, match=message):
        plan({"prompt": f"x {tag}"}, inputs=Inputs(folders=Folders(lora_dir=folder)))


def test_limits_and_names_fail_before_queueing() -> None:
    limits = Limits(max_width=256, max_height=256, max_steps=10, max_batch=4)
    for payload, flag in (
        ({"width": 512}, "--max-width"),
        ({"height": 512}, "--max-height"),
        ({"steps": 11}, "--max-steps"),
        ({"batch_size": 3, "n_iter": 2, "steps": 5}, "--max-batch"),
    ):
        with pytest.raises(InputError, match=flag):
            plan_generation(Txt2ImgRequest(**payload), limits)
    with pytest.raises(UnknownSchedulerError):
        plan({"sampler_name": "Eulr"})
    with pytest.raises(InputError, match="strength"):
        plan_generation(
            Img2ImgRequest(init_images=["x"], denoising_strength=0),
            Limits(),
            Inputs(init_image=Image.new("RGB", (8, 8))),
        )


def test_info_is_a1111_shaped() -> None:
    from sdkit.pipelines import GenerationParameters

    result = plan({"prompt": "p <hypernet:a:1>", "seed": 9, "batch_size": 2})
    result.loras = [(Path("styles/a.safetensors"), 0.5)]
    params = [GenerationParameters("p ", "", 50, "euler", "normal", 7.0, 9 + i, 64, 64, "m") for i in range(2)]
    info = build_info(result, params, "m", worker="host:1")
    assert info["all_seeds"] == [9, 10] and info["seed"] == 9 and info["sd_model_name"] == "m"
    assert info["infotexts"][1].endswith("Seed: 10, Size: 64x64, Model: m, Software: sdkit")
    assert set(info["ignored"]) == {"prompt <hypernet:a:1>"} and info["interrupted"] is False
    assert info["loras"] == [{"name": "a", "weight": 0.5, "applied": True}]


def test_scheduler_labels_and_names() -> None:
    from sdkit_serve.schemas import schedule_name, schedulers

    assert schedule_name(None) is None and schedule_name("Automatic") is None and schedule_name("") is None
    assert schedule_name("SGM Uniform") == "sgm_uniform" and schedule_name("karras") == "karras"
    assert schedule_name("Polyexponential") == "Polyexponential"  # sdkit says what it knows
    for item in schedulers()[1:]:
        assert plan({"scheduler": item.label, "steps": 4}).generate["schedule"] == item.name


def test_listings_name_issue_27_samplers_and_schedules() -> None:
    """/sdapi/v1/samplers and /sdapi/v1/schedulers (A1111 1.9+ shape) list what sdkit has; a flow
    variant is one more name of its sampler, not a second entry."""
    from sdkit_serve.schemas import samplers, schedulers

    listed = {item.name: item.aliases for item in samplers()}
    assert {"UniPC", "DEIS", "iPNDM", "iPNDM_v", "TCD"} <= set(listed)
    assert "uni_pc_flow" in listed["UniPC"] and len(listed) == len({item.name for item in samplers()})
    assert "dpmpp_2m_sde_flow" in listed["DPM++ 2M SDE"] and "dpmpp_3m_sde_flow" in listed["DPM++ 3M SDE"]
    assert "ddpm_flow" in listed["DDPM"] and "dpmpp_2m_cfg_pp_flow" in listed["DPM++ 2M CFG++"]
    assert "dpmpp_sde_flow" in listed["DPM++ SDE"] and "ddim_flow" in listed["DDIM"] and "lcm_flow" in listed["LCM"]
    labels = {item.label: item for item in schedulers()}
    assert {"Align Your Steps", "KL Optimal", "Linear Quadratic"} <= set(labels)
    assert labels["Align Your Steps"].name == "align_your_steps" and "ays" in (labels["Align Your Steps"].aliases or [])


def test_inpainting_fields() -> None:
    image = Image.new("RGB", (64, 48))
    mask = Image.new("RGB", (64, 48))
    mask.paste((255, 255, 255), (8, 8, 24, 24))
    payload = Img2ImgRequest(init_images=["x"], mask="m", mask_blur=3, inpainting_fill=1, inpainting_mask_invert=1)
    result = plan_generation(payload, Limits(), Inputs(init_image=image, mask=mask))
    generate = result.generate
    assert generate["mask"].dtype == np.uint8 and generate["mask"].shape == (48, 64)
    assert generate["mask"][0, 0] == 255 and generate["mask"][10, 10] == 0  # inverted: black repaints
    assert (generate["mask_blur"], generate["inpaint_full_res"], generate["inpaint_full_res_padding"]) == (3, True, 0)
    assert generate["paste_back"] is True and result.ignored == {}
    defaults = plan_generation(Img2ImgRequest(init_images=["x"], mask="m"), Limits(), Inputs(image, mask))
    assert defaults.generate["mask_blur"] == 4  # A1111's mask_blur_x/y
    assert defaults.generate["inpainting_fill"] == 0 and defaults.ignored == {}  # A1111's default: fill
    uneven = Img2ImgRequest(init_images=["x"], mask="m", mask_blur_x=2, mask_blur_y=5, inpainting_fill=1)
    assert "mask_blur_x (2) is used" in plan_generation(uneven, Limits(), Inputs(image, mask)).ignored["mask_blur_y"]


def test_hires_fields() -> None:
    result = plan(
        {
            "enable_hr": True,
            "hr_scale": 1.5,
            "hr_upscaler": "Latent (nearest)",
            "hr_second_pass_steps": 3,
            "denoising_strength": 0.5,
            "hr_sampler_name": "Use same sampler",
            "hr_prompt": "",
            "hr_cfg": 7.0,
            "sampler_name": "euler_a",
        }
    )
    assert {k: result.generate[k] for k in ("enable_hr", "hr_scale", "hr_upscaler", "denoising_strength")} == {
        "enable_hr": True,
        "hr_scale": 1.5,
        "hr_upscaler": "Latent (nearest)",
        "denoising_strength": 0.5,
    }
    assert result.generate["hr_second_pass_steps"] == 3 and result.ignored == {}  # "same as the first pass"
    assert "hr_sampler" not in result.generate and "hr_prompt" not in result.generate  # "Use same", ""
    other = plan({"enable_hr": True, "hr_sampler_name": "Heun", "hr_prompt": "another", "hr_cfg": 3})
    assert (other.generate["hr_sampler"], other.generate["hr_schedule"], other.generate["hr_prompt"]) == (
        "Heun",
        None,
        "another",
    )
    assert other.generate["hr_guidance_scale"] == 3 and other.ignored == {}
    assert (
        "loaded model"
        in plan({"enable_hr": True, "hr_checkpoint_name": "other.safetensors"}).ignored["hr_checkpoint_name"]
    )
    assert plan({"enable_hr": True}).generate["hr_upscaler"] == "Latent"  # A1111's default
    with pytest.raises(InputError, match="hr_scheduler must be a string"):
        plan({"enable_hr": True, "hr_scheduler": 3})
    with pytest.raises(InputError, match="unknown hires upscaler 'R-ESRGAN 4x\\+'"):
        plan({"enable_hr": True, "hr_upscaler": "R-ESRGAN 4x+"})
    assert "enable_hr" not in plan({"hr_scale": 3, "hr_upscaler": "x"}).generate  # off: the fields do nothing


def test_sampler_options() -> None:
    assert plan({"sampler_name": "DDIM", "eta": 0.3}).generate["sampler_options"] == {"eta": 0.3}
    assert plan({"sampler_name": "Euler a", "s_noise": 0.9}).generate["sampler_options"] == {"s_noise": 0.9}
    assert plan({"sampler_name": "Euler", "eta": 0.3, "s_noise": 0.5}).ignored == {}  # deterministic: as A1111
    assert "no eta option" in plan({"sampler_name": "Euler a", "eta": 0.5}).ignored["eta"]
    assert plan({"sampler_name": "Euler a", "eta": 1.0}).ignored == {}  # A1111's ancestral eta
    # DDIM with a schedule its diffusers class lacks runs ComfyUI's ddim, which has no eta: reported
    karras = plan({"sampler_name": "DDIM", "scheduler": "Karras", "eta": 0.3})
    assert "ddim_sigmas sampler has no eta option" in karras.ignored["eta"]
    assert plan({"sampler_name": "DDIM", "scheduler": "Karras", "eta": 0.0}).ignored == {}


def test_controlnet_units(tmp_path: Path) -> None:
    import base64
    import io

    for name in ("canny_a", "depth_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"")
        (tmp_path / name / "config.json").write_text("{}")
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buffer, format="PNG")
    picture = base64.b64encode(buffer.getvalue()).decode()
    unit = {"image": picture, "model": "canny_a [abc123]", "module": "canny", "weight": 0.7, "guidance_end": 0.5}
    unit |= {"threshold_a": 50, "threshold_b": 150, "resize_mode": "Just Resize", "control_mode": 0}
    disabled = {"enabled": False, "model": "depth_b", "image": picture}
    scripts = {"controlnet": {"args": [unit, disabled, {"model": "None"}]}, "adetailer": {"args": []}}
    inputs = Inputs(
        folders=Folders(controlnet_dir=tmp_path), decode=lambda text, what: decode_image(text, what, Limits())
    )
    result = plan({"alwayson_scripts": scripts, "width": 64, "height": 64}, inputs=inputs)
    [control] = result.generate["control"]
    assert (control["model"], control["scale"], control["start"], control["end"]) == ("canny_a", 0.7, 0.0, 0.5)
    assert control["preprocessor"] == "canny" and control["preprocessor_params"] == {
        "low_threshold": 50,
        "high_threshold": 150,
    }
    assert result.controlnets == {"canny_a": tmp_path / "canny_a"}
    assert set(result.ignored) == {"alwayson_scripts.adetailer", "alwayson_scripts.controlnet.args[2]"}
    unit |= {"resize_mode": "Crop and Resize", "control_mode": "My prompt is more important"}
    square = plan({"alwayson_scripts": {"controlnet": {"args": [unit]}}, "width": 64, "height": 64}, inputs=inputs)
    assert set(square.ignored) == {"alwayson_scripts.controlnet.args[0].control_mode"}  # same aspect: same image
    wide = plan({"alwayson_scripts": {"controlnet": {"args": [unit]}}, "width": 64, "height": 32}, inputs=inputs)
    assert "alwayson_scripts.controlnet.args[0].resize_mode" in wide.ignored
    for bad, message in (
        ({**unit, "model": "../canny_a"}, "not a path"),
        ({**unit, "model": "canny_c"}, "unknown ControlNet model 'canny_c'"),
        ({**unit, "module": "openpose"}, "unknown ControlNet module"),
        ({**unit, "image": None}, "txt2img needs one"),
    ):
        with pytest.raises(InputError, match=message):
            plan({"alwayson_scripts": {"controlnet": {"args": [bad]}}}, inputs=inputs)
