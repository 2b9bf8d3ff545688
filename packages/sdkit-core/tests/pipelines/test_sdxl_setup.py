"""SDXL without generating: the request's fields, ``time_ids`` rules (diffusers' source as the
oracle, quoted per case), the folder loader, the VAE precision rule, the refiner split checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.pipelines import GenerationRequest, StableDiffusionPipeline, StableDiffusionXLPipeline, XLRequest
from sdkit.pipelines.loaders.diffusers_folder import folder_config, read_folder
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.pipelines.models.sdxl import time_ids
from sdkit.schedulers import create_scheduler
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


def offload(folder: Path | str, **options: Any) -> Any:
    """A pipeline whose components compile only when used (these tests never run them)."""
    return sdkit.load_pipeline(folder, backend="reference", memory="offload", **options)


# -- the request ------------------------------------------------------------------------------


def test_xl_request_fields_are_checked_once() -> None:
    request = XLRequest.create("a", original_size=[64, 96], crops_coords_top_left=np.array([4, 8]), prompt_2=None)
    assert request.original_size == (64, 96) and request.crops_coords_top_left == (4, 8)
    assert request.prompt_2 == "" and request.refiner is None and request.refiner_switch_at == 0.8
    assert (request.aesthetic_score, request.negative_aesthetic_score) == (6.0, 2.5)
    for bad, match in [
        ({"original_size": (64,)}, "original_size must be a .height, width. pair"),
        ({"target_size": (0, 8)}, "target_size must be .* >= 1"),
        ({"crops_coords_top_left": (-1, 0)}, "crops_coords_top_left must be .* >= 0"),
        ({"negative_target_size": "64x64"}, "negative_target_size"),
        ({"refiner_switch_at": 1.0}, "refiner_switch_at must be between 0 and 1"),
        ({"refiner_switch_at": "soon"}, "refiner_switch_at must be a number"),
        ({"refiner": "path/to/refiner"}, "refiner must be an SDXL pipeline"),
        ({"aesthetic_score": float("nan")}, "aesthetic_score must be a finite number"),
        ({"prompt_2": 3}, "prompt_2 must be a string"),
        ({"prompt_weighting": "compel"}, "prompt_weighting must be one of none, a1111"),
    ]:
        with pytest.raises(InputError, match=match):
            XLRequest.create("a", **bad)


def test_sd_pipelines_refuse_sdxl_fields() -> None:
    pipe = offload(ROOT / "sd15")
    assert type(pipe) is StableDiffusionPipeline
    with pytest.raises(OptionError, match="unknown generation option 'prompt_2'"):
        pipe.generate("a cat", prompt_2="a dog")
    with pytest.raises(OptionError, match="original_size is not an option of sd15"):
        pipe.accept(XLRequest.create("a cat", original_size=(64, 64)))
    assert type(pipe.accept(XLRequest.create("a cat"))) is XLRequest  # defaults only: nothing lost


def test_a_base_request_becomes_an_xl_request() -> None:
    pipe = offload(ROOT / "sdxl")
    request = pipe.accept(GenerationRequest.create("a cat", seed=3, steps=2))
    assert type(request) is XLRequest and request.seed == 3 and request.steps == 2


# -- time_ids, as diffusers' _get_add_time_ids and __call__ fill them --------------------------


def rows(
    height: int = 32, width: int = 48, *, img2img: bool = False, aesthetic: bool = False, **fields: Any
) -> list[list[float]]:
    ids = time_ids(XLRequest.create("a", **fields), height, width, img2img=img2img, aesthetic=aesthetic)
    result: list[list[float]] = ids.tolist()
    return result


def test_time_ids_txt2img() -> None:
    # StableDiffusionXLPipeline: original/target default to (height, width), crop (0, 0).
    assert rows() == [[32, 48, 0, 0, 32, 48]] * 2
    assert rows(original_size=(64, 96), crops_coords_top_left=(4, 8)) == [[64, 96, 4, 8, 32, 48]] * 2
    # "if negative_original_size is not None and negative_target_size is not None": else positive
    assert rows(negative_original_size=(16, 24), negative_crops_coords_top_left=(1, 2))[0] == [32, 48, 0, 0, 32, 48]
    both = rows(negative_original_size=(16, 24), negative_target_size=(8, 8), negative_crops_coords_top_left=(1, 2))
    assert both == [[16, 24, 1, 2, 8, 8], [32, 48, 0, 0, 32, 48]]


def test_time_ids_img2img_and_refiner() -> None:
    # StableDiffusionXLImg2ImgPipeline: negative sizes default to the positive ones, and the
    # negative row takes the positive crop ("negative_original_size + crops_coords_top_left + ...").
    fields = {"crops_coords_top_left": (4, 8), "negative_crops_coords_top_left": (1, 2), "negative_target_size": (8, 8)}
    assert rows(img2img=True, **fields) == [[32, 48, 4, 8, 8, 8], [32, 48, 4, 8, 32, 48]]
    # requires_aesthetics_score: original + crop + score; negative original + negative crop + score
    aesthetic = rows(aesthetic=True, img2img=True, aesthetic_score=7, negative_original_size=(16, 24), **fields)
    assert aesthetic == [[16, 24, 1, 2, 2.5], [32, 48, 4, 8, 7.0]]


# -- the folder loader --------------------------------------------------------------------------


def test_sdxl_folders_are_recognised_without_loading_models() -> None:
    assert pipeline_class_for(ROOT / "sdxl") is StableDiffusionXLPipeline
    assert pipeline_class_for(ROOT / "sdxl_refiner") is StableDiffusionXLPipeline
    assert pipeline_class_for(ROOT / "sd15") is StableDiffusionPipeline
    base = folder_config(read_folder(ROOT / "sdxl"))
    assert base.text_outputs == {
        "text_encoder": ("hidden_states.4",),
        "text_encoder_2": ("hidden_states.4", "text_embeds"),
    }
    assert base.vae_scaling_factor == 0.13025 and base.force_zeros_for_empty_prompt
    assert not base.requires_aesthetics_score and base.fp32_components == ("vae_decoder", "vae_encoder")
    assert set(base.tokenizers) == {"text_encoder", "text_encoder_2"}
    refiner = folder_config(read_folder(ROOT / "sdxl_refiner"))
    assert refiner.requires_aesthetics_score and not refiner.force_zeros_for_empty_prompt
    assert set(refiner.text_outputs) == set(refiner.tokenizers) == {"text_encoder_2"}
    pipe = offload(ROOT / "sdxl_refiner")
    assert set(pipe.components) == {"text_encoder_2", "unet", "vae_decoder", "vae_encoder"} and pipe.is_refiner


def edited(tmp_path: Path, folder: str, change: Any) -> Path:
    """A copy of a fixture folder's configs (empty model files: only the layout is read)."""
    copy = tmp_path / folder
    shutil.copytree(ROOT / folder, copy, ignore=shutil.ignore_patterns("model.onnx"))
    for model in (ROOT / folder).glob("*/model.onnx"):
        (copy / model.parent.name / "model.onnx").touch()
    change(copy)
    return copy


def write_json(path: Path, update: dict[str, Any], remove: tuple[str, ...] = ()) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(update)
    for key in remove:
        data.pop(key)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_sdxl_folder_problems_are_one_error(tmp_path: Path) -> None:
    def no_layers(copy: Path) -> None:
        write_json(copy / "text_encoder_2" / "config.json", {}, remove=("num_hidden_layers",))

    def wrong_aesthetics(copy: Path) -> None:
        write_json(copy / "model_index.json", {"requires_aesthetics_score": False})

    def kandinsky(copy: Path) -> None:
        write_json(copy / "model_index.json", {"_class_name": "KandinskyV22Pipeline"})

    for change, match in [
        (no_layers, "text_encoder_2/config.json must give num_hidden_layers"),
        (wrong_aesthetics, "the UNet takes 5 time ids but model_index.json says requires_aesthetics_score=false"),
        (kandinsky, "KandinskyV22Pipeline is not a supported pipeline"),
    ]:
        copy = edited(tmp_path / change.__name__, "sdxl_refiner", change)
        with pytest.raises(ModelFormatError, match=match):
            folder_config(read_folder(copy))
    copy = edited(tmp_path / "no_te2", "sdxl", lambda c: (c / "text_encoder_2" / "model.onnx").unlink())
    with pytest.raises(ModelFormatError, match=r"missing model file text_encoder_2/model\.onnx"):
        read_folder(copy)


def test_aesthetics_inferred_from_the_unet_when_model_index_is_silent(tmp_path: Path) -> None:
    copy = edited(
        tmp_path, "sdxl_refiner", lambda c: write_json(c / "model_index.json", {}, ("requires_aesthetics_score",))
    )
    assert folder_config(read_folder(copy)).requires_aesthetics_score


# -- the VAE stays fp32 --------------------------------------------------------------------------


def precisions(pipe: Any) -> dict[str, str | None]:
    return {name: (c.options or {}).get("precision") for name, c in pipe.components.items()}


def test_sdxl_vae_stays_fp32_unless_named() -> None:
    assert precisions(offload(ROOT / "sdxl", precision="fp16")) == {
        "text_encoder": "fp16",
        "text_encoder_2": "fp16",
        "unet": "fp16",
        "unet_controlnet": "fp16",  # the fixture's SDXL has the ControlNet UNet too
        "vae_decoder": "fp32",
        "vae_encoder": "fp32",
    }
    mapping = {"default": "fp16", "vae_decoder": "fp16"}  # named: the user's choice wins
    assert precisions(offload(ROOT / "sdxl", precision=mapping))["vae_decoder"] == "fp16"
    assert precisions(offload(ROOT / "sdxl", precision=mapping))["vae_encoder"] == "fp32"
    assert set(precisions(offload(ROOT / "sd15", precision="fp16")).values()) == {"fp16"}  # SD: no rule
    assert set(precisions(offload(ROOT / "sdxl")).values()) == {None}  # nothing asked: backend default
    with pytest.raises(OptionError, match="unknown pipeline component 'vae'"):
        offload(ROOT / "sdxl", precision={"vae": "fp16"})


# -- the refiner split ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xl_pair() -> Any:
    return offload(ROOT / "sdxl"), offload(ROOT / "sdxl_refiner")


def test_switch_that_leaves_a_stage_nothing_is_refused(xl_pair: Any) -> None:
    base, refiner = xl_pair
    # SDXL's schedule for 6 steps is 831, 665, 499, 333, 167, 1 ("leading", steps_offset 1)
    for switch, stage in [(0.1, "base"), (0.9995, "refiner")]:
        request = XLRequest.create("a", steps=6, refiner=refiner, refiner_switch_at=switch, width=48, height=32)
        with pytest.raises(InputError, match=f"leaves no step for the {stage}"):
            base.plan(request)


def test_sd_pipeline_is_no_refiner(xl_pair: Any) -> None:
    with pytest.raises(InputError, match="refiner must be an SDXL pipeline"):
        xl_pair[0].generate("a", refiner=offload(ROOT / "sd15"))


@pytest.mark.parametrize("steps", [5, 6])
def test_second_order_refiner_ends_on_a_whole_step(xl_pair: Any, steps: int) -> None:
    """diffusers' img2img ``get_timesteps`` with ``denoising_start``: the timesteps below the cutoff,
    plus one when a second-order scheduler would otherwise stop between its two evaluations."""
    base, refiner = xl_pair
    request = XLRequest.create("a", steps=steps, sampler="heun", refiner=refiner, refiner_switch_at=0.5)
    stage = base.plan(base.accept(request)).refiner
    full = create_scheduler("heun", config=refiner.config.scheduler_config)
    full.set_timesteps(steps)
    below = int(np.count_nonzero(np.asarray(full.timesteps) < 500))
    expected = below + 1 if below % 2 == 0 else below
    assert len(stage.plan.scheduler.timesteps) == expected and expected % 2 == 1
    assert list(stage.plan.scheduler.timesteps) == list(full.timesteps[-expected:])
    assert stage.base_steps == int(np.count_nonzero(np.asarray(full.timesteps) >= 500))


# -- scheduler-config fix-ups, applied by every pipeline ------------------------------------------


def test_sd_pipeline_applies_diffusers_config_fixups(tmp_path: Path) -> None:
    """``sd15_ddim_euler_config``: an EulerDiscrete config (no clip_sample, no steps_offset) with
    DDIM. StableDiffusionPipeline's constructor sets clip_sample=False and steps_offset=1; without
    that the image moves by 0.81 (golden.json sensitivity)."""
    case = GOLDENS.case("sd15_ddim_euler_config")
    copy = tmp_path / "sd15"
    shutil.copytree(ROOT / "sd15", copy)
    euler_only = GOLDENS.meta["scheduler_configs"]["euler_only"]
    (copy / "scheduler" / "scheduler_config.json").write_text(json.dumps(euler_only))
    pipe = sdkit.load_pipeline(copy, backend="reference", threads=1)
    fields = {k: case[k] for k in ("negative_prompt", "seed", "steps", "guidance_scale", "sampler", "width", "height")}
    image = pipe.generate(case["prompt"], output_type="np", **fields)
    assert np.abs(image - GOLDENS.array("sd15_ddim_euler_config/image")).max() <= 1e-3


def test_built_from_a_config_and_components_alone() -> None:
    """What a single-file SDXL family does: a ``PipelineConfig`` written in code (no folder
    config read) and components from any ``ModelSource``; the first UNet feeds are diffusers'."""
    from sdkit.model import load_onnx
    from sdkit.pipelines import LoadSettings, ModelInMemory, PipelineConfig

    config = PipelineConfig(
        name="family-xl",
        vae_scaling_factor=0.13025,
        vae_scale_factor=2,
        sample_size=32,
        scheduler_config=json.loads((ROOT / "sdxl" / "scheduler" / "scheduler_config.json").read_text()),
        tokenizers={"text_encoder": ROOT / "sdxl" / "tokenizer", "text_encoder_2": ROOT / "sdxl" / "tokenizer_2"},
        text_outputs={"text_encoder": ("hidden_states.4",), "text_encoder_2": ("hidden_states.4", "text_embeds")},
        force_zeros_for_empty_prompt=True,
        fp32_components=("vae_decoder", "vae_encoder"),
    )
    sources = {
        name: ModelInMemory(load_onnx(ROOT / "sdxl" / name / "model.onnx"), name)
        for name in ("text_encoder", "text_encoder_2", "unet", "vae_decoder")
    }
    settings = LoadSettings.create(backend="reference", memory="offload")
    pipe = StableDiffusionXLPipeline(
        config, settings.components(StableDiffusionXLPipeline.component_names, sources, config.text_outputs)
    )
    case = GOLDENS.case("sdxl_euler")
    fields = ("prompt_2", "negative_prompt", "guidance_scale", "original_size", "crops_coords_top_left")
    fields += ("target_size", "negative_original_size", "negative_crops_coords_top_left", "negative_target_size")
    request = XLRequest.create(case["prompt"], width=48, height=32, **{k: case[k] for k in fields})
    feeds = pipe.conditioning(pipe.plan(request))
    for name in ("encoder_hidden_states", "text_embeds", "time_ids"):
        assert np.abs(feeds[name] - GOLDENS.array(f"sdxl_euler/unet0/{name}")).max() <= 1e-5, name
