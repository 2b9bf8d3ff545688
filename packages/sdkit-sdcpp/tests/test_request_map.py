"""A GenerationRequest as generate_image keywords: each field passed on with its meaning, or refused
naming it; LoRAs as sd.cpp's tags; the plan's size and seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sdcpp_helpers import needs_binding

from sdkit.errors import InputError, OptionError
from sdkit.pipelines import GenerationRequest, PipelineConfig
from sdkit.pipelines.control_units import ControlUnit
from sdkit_sdcpp.context import Context
from sdkit_sdcpp.engine import ContextSettings, ModelFiles
from sdkit_sdcpp.pipeline import SdcppPipeline
from sdkit_sdcpp.request_map import generate_kwargs


def _pipeline(size: int = 512) -> SdcppPipeline:
    context = Context(ModelFiles(model=Path("m.gguf")), ContextSettings())
    return SdcppPipeline(PipelineConfig(name="m", sample_size=size // 8), context, "SD 1.x")


def test_txt2img_fields() -> None:
    request = GenerationRequest.create(
        "a cat", negative_prompt="blurry", seed=3, width=64, height=96, steps=7, guidance_scale=4.5,
        sampler="DPM++ 2M Karras", num_images=2,
    )  # fmt: skip
    assert generate_kwargs(request, 64, 96) == {
        "prompt": "a cat", "negative_prompt": "blurry", "width": 64, "height": 96, "cfg_scale": 4.5,
        "sample_method": "dpm++2m", "scheduler": "karras", "sample_steps": 7, "seed": 3, "batch_count": 2,
    }  # fmt: skip


def test_img2img_inpainting_tiling_hires() -> None:
    image = Image.new("RGB", (64, 64), (10, 20, 30))
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    request = GenerationRequest.create(
        "x", init_image=image, strength=0.6, mask=mask, vae_tiling=True, vae_tile_size=256, seed=1
    )
    kwargs = generate_kwargs(request, 64, 64)
    assert kwargs["strength"] == 0.6 and kwargs["init_image"].size == (64, 64)
    assert np.array_equal(np.asarray(kwargs["mask_image"]), mask)
    assert (kwargs["vae_tiling"], kwargs["vae_tile_size"], kwargs["vae_tile_overlap"]) == (True, "32x32", 0.25)
    hires = GenerationRequest.create("x", enable_hr=True, hr_scale=1.5, hr_upscaler="Latent (nearest-exact)")
    kwargs = generate_kwargs(hires, 64, 64)
    assert kwargs["hires"] and kwargs["hires_upscaler"] == "latent_nearest_exact" and kwargs["hires_scale"] == 1.5


def test_loras_are_tags_with_absolute_paths(tmp_path: Path) -> None:
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"")
    request = GenerationRequest.create("a cat <lora:style:0.5>, studio", seed=1)
    kwargs = generate_kwargs(request, 64, 64, [(lora, 0.5)])
    assert kwargs["prompt"] == f"a cat , studio<lora:{lora}:0.5>"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mask_blur": 4}, "mask_blur: stable-diffusion.cpp does not do A1111's mask blur"),
        ({"inpaint_full_res": True}, "inpaint_full_res"),
        ({"paste_back": True}, "paste_back"),
        ({"restore_faces": "GFPGAN"}, "restore_faces: stable-diffusion.cpp does not do face restoration"),
        ({"latents": np.zeros((1, 4, 8, 8), np.float32)}, "latents"),
        ({"sampler": "DPM++ SDE"}, "sampler 'dpmpp_sde'"),
        ({"schedule": "beta"}, "schedule 'beta'"),
        ({"hr_upscaler": "Lanczos", "enable_hr": True, "prompt": "(cat:1.2)"}, "prompt_weighting='none'"),
    ],
)
def test_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    prompt = str(fields.pop("prompt", "a cat"))
    if fields.get("mask_blur") or fields.get("inpaint_full_res") or fields.get("paste_back"):
        fields.update(init_image=Image.new("RGB", (64, 64)), mask=np.full((64, 64), 255, np.uint8))
    request = GenerationRequest.create(prompt, **fields)
    with pytest.raises(OptionError, match=message):
        _pipeline().plan(request)


def test_a1111_weighting_is_accepted() -> None:
    request = GenerationRequest.create("a (cat:1.2) BREAK dog", prompt_weighting="a1111")
    assert generate_kwargs(request, 64, 64)["prompt"] == "a (cat:1.2) BREAK dog"


def test_one_controlnet_unit_maps_to_control_image_and_strength(tmp_path: Path) -> None:
    hint = np.zeros((32, 48, 3), np.uint8)
    hint[:, 24:] = 255
    unit = ControlUnit.create((hint, "edges", 0.7))
    request = GenerationRequest.create("x", control=[unit])
    kwargs = generate_kwargs(request, 96, 64, controlnet="edges")
    assert kwargs["control_strength"] == 0.7
    expected = Image.fromarray(hint).resize((96, 64), Image.Resampling.LANCZOS)  # as sdkit's pipelines
    assert np.array_equal(np.asarray(kwargs["control_image"]), np.asarray(expected))
    with pytest.raises(OptionError, match="control: no ControlNet is loaded"):
        generate_kwargs(request, 96, 64)
    with pytest.raises(OptionError, match=r"control\[0\].model: 'edges' is not loaded"):
        generate_kwargs(request, 96, 64, controlnet="depth")
    with pytest.raises(OptionError, match="runs one ControlNet unit per generation, not 2"):
        generate_kwargs(GenerationRequest.create("x", control=[unit, unit]), 96, 64, controlnet="edges")
    late = ControlUnit.create({"input_image": hint, "model": "edges", "guidance_start": 0.2})
    with pytest.raises(OptionError, match=r"control\[0\].start/end \(0.2, 1\)"):
        generate_kwargs(GenerationRequest.create("x", control=[late]), 96, 64, controlnet="edges")


def test_set_controlnets_loads_one_file_with_the_model(tmp_path: Path) -> None:
    pipe = _pipeline()
    net = tmp_path / "control_canny.safetensors"
    net.write_bytes(b"x")
    pipe.set_controlnets(net)
    assert pipe.controlnet == "control_canny" and pipe.context.files.control_net == net.resolve()
    assert pipe.context.files.constructor_kwargs()["control_net_path"] == str(net.resolve())
    with pytest.raises(OptionError, match="loads one ControlNet with the model, not 2"):
        pipe.set_controlnets({"a": net, "b": net})
    with pytest.raises(OptionError, match="controlnet backend 'ggml'"):
        pipe.set_controlnets(net, backend="ggml")
    pipe.set_controlnets(None)
    assert pipe.controlnet is None and pipe.context.files.control_net is None


def test_reference_images_map_to_ref_images_on_the_families_that_read_them() -> None:
    from sdkit_sdcpp.pipeline import SdcppFlowRequest

    image = np.full((16, 16, 3), 200, np.uint8)
    request = SdcppFlowRequest.create("make it red", reference_images=[image])
    [reference] = generate_kwargs(request, 64, 64, family="FLUX.1")["ref_images"]
    assert reference.mode == "RGB" and np.array_equal(np.asarray(reference), image)
    assert len(generate_kwargs(request, 64, 64, family="Qwen-Image")["ref_images"]) == 1
    for family in ("SD3", "Chroma", "FLUX.1 Fill", "Z-Image"):
        with pytest.raises(OptionError, match=f"reference_images: a {family} model takes no reference images"):
            generate_kwargs(request, 64, 64, family=family)
    with pytest.raises(OptionError, match="reference_images is not an option"):
        _pipeline().run(request)  # an SD 1.x pipeline's request has no such field: refused before it runs


def test_plan_sizes_and_seeds() -> None:
    plan = _pipeline(1024).plan(GenerationRequest.create("x", seed=5, num_images=3))
    assert (plan.width, plan.height, plan.seeds) == (1024, 1024, [5, 6, 7])
    image = Image.new("RGB", (100, 70))
    plan = _pipeline().plan(GenerationRequest.create("x", init_image=image))
    assert (plan.width, plan.height) == (96, 64)
    with pytest.raises(InputError, match=r"seed: stable-diffusion.cpp takes seeds from 0"):
        _pipeline().plan(GenerationRequest.create("x", seed=1 << 63))


def test_adapters_are_checked_files(tmp_path: Path) -> None:
    pipe = _pipeline()
    pickle = tmp_path / "style.pt"
    pickle.write_bytes(b"")
    with pytest.raises(InputError, match=r"given .safetensors or .gguf files only"):
        pipe.set_loras([(pickle, 1.0)])
    with pytest.raises(InputError, match="no such file"):
        pipe.set_vae(tmp_path / "vae.safetensors")
    vae = tmp_path / "vae.safetensors"
    vae.write_bytes(b"")
    assert pipe.set_vae(vae) == {"pipeline": "recompile"} and pipe.context.files.vae == vae.resolve()
    embedding = tmp_path / "style_token.safetensors"
    embedding.write_bytes(b"")
    pipe.load_embedding(embedding)
    assert [p.stem for p in pipe.context.files.embeddings] == ["style_token"]
    with pytest.raises(InputError, match="names an embedding by its file"):
        pipe.load_embedding(embedding, name="other")
    pipe.unload_embeddings()
    assert pipe.context.files.embeddings == ()


def test_flux_guidance_is_distilled_and_requests_default_to_euler(tmp_path: Path) -> None:
    from sdkit.pipelines import FlowRequest
    from sdkit.pipelines.loaders.loading import pipeline_class_for
    from sdkit.testing.gguf_files import write_gguf
    from sdkit_sdcpp.pipeline import SdcppFlowPipeline

    keys = {
        "double_blocks.0.img_attn.qkv.weight": ((96, 32), "f16"),
        "single_blocks.0.linear1.weight": ((96, 32), "f16"),
    }
    assert pipeline_class_for(write_gguf(tmp_path / "flux.gguf", keys)) is SdcppFlowPipeline
    request = FlowRequest.create("a cat", guidance_scale=3.5, seed=1)
    kwargs = generate_kwargs(request, 64, 64, family="FLUX.1")
    assert (kwargs["cfg_scale"], kwargs["guidance"], kwargs["sample_method"]) == (1.0, 3.5, "euler")
    assert "guidance" not in generate_kwargs(request, 64, 64, family="SD3")
    with pytest.raises(OptionError, match="max_sequence_length"):
        generate_kwargs(FlowRequest.create("a cat", max_sequence_length=64), 64, 64, family="FLUX.1")


def test_a_generation_over_the_memory_budget_is_refused_before_sdcpp(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdkit.errors import ResourceLimitError

    monkeypatch.setenv("SDKIT_MEMORY_BUDGET", "64M")
    with pytest.raises(ResourceLimitError):
        _pipeline().plan(GenerationRequest.create("x", width=8192, height=8192))


def test_isolate_is_an_option_and_follows_sdkit_isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ContextSettings.from_options({"isolate": True}, "keep", {}).isolate
    monkeypatch.setenv("SDKIT_ISOLATE", "1")
    assert ContextSettings.from_options({}, "keep", {}).isolate
    with pytest.raises(OptionError, match="isolate"):
        ContextSettings.from_options({"isolate": "yes"}, "keep", {})


@needs_binding
def test_every_keyword_is_the_bindings() -> None:
    """The keywords the mapping writes (ControlNet, reference images, hires, tiling...) and the
    context's are parameters of the installed binding's ``generate_image`` / ``StableDiffusion``."""
    import inspect

    from sdkit_sdcpp import binding
    from sdkit_sdcpp.pipeline import SdcppFlowRequest

    module = binding.import_binding()
    hint = np.zeros((8, 8, 3), np.uint8)
    edit = SdcppFlowRequest.create(
        "x", reference_images=[hint], control=[(hint, None, 0.5)], init_image=Image.new("RGB", (64, 64)),
        mask=np.full((64, 64), 255, np.uint8), vae_tiling=True,
    )  # fmt: skip
    kwargs = generate_kwargs(edit, 64, 64, family="FLUX.1", controlnet="net")
    hires = SdcppFlowRequest.create("x", enable_hr=True, hr_upscaler="Lanczos")
    kwargs.update(generate_kwargs(hires, 64, 64, family="FLUX.1"))
    assert {"ref_images", "control_image", "control_strength", "hires", "vae_tiling", "mask_image"} <= set(kwargs)
    accepted = inspect.signature(module.StableDiffusion.generate_image).parameters
    assert set(kwargs) <= set(accepted)
    files = ModelFiles(model=Path("m.gguf"), vae=Path("v"), control_net=Path("c"), embeddings=(Path("e"),))
    made = {**files.constructor_kwargs(), **ContextSettings().constructor_kwargs()}
    assert set(made) <= set(inspect.signature(module.StableDiffusion.__init__).parameters)
