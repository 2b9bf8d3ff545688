"""Declared features: each pipeline class lists what it supports beyond txt2img, and the plan
refuses a request asking for anything else, naming the feature and the family, before anything
compiles or runs (issue 24: the flow pipelines used to return the plain image for ``mask=``,
``enable_hr=True`` and ``vae_tiling=True``, as if they had not been given).

No oracle is needed: the checks are that the refusal happens, what it names, and that no
component has compiled or run when it does (``Pipeline.backends()`` all None).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, SdkitError, UnsupportedFeatureError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.features.feature import Feature, refuse_undeclared, requested_features
from sdkit.pipelines.models.chroma import ChromaPipeline
from sdkit.pipelines.models.flow_request import FlowRequest
from sdkit.pipelines.models.flux import FluxPipeline
from sdkit.pipelines.models.sd3 import StableDiffusion3Pipeline
from sdkit.pipelines.models.sdxl import StableDiffusionXLPipeline
from sdkit.pipelines.models.stable_diffusion import StableDiffusionPipeline
from sdkit.testing.cli_output import without_progress

FLOW = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
FLOW_FAMILIES = {"sd3": "SD3", "flux_dev": "FLUX.1", "flux_schnell": "FLUX.1", "chroma": "Chroma"}
SIZE = {"width": 48, "height": 32, "steps": 2, "seed": 1, "max_sequence_length": 32, "output_type": "np"}
SD_FEATURES = {
    Feature.IMG2IMG,
    Feature.MASK,
    Feature.CONTROLNET,
    Feature.HIRES,
    Feature.VAE_TILING,
    Feature.PROMPT_WEIGHTING,
    Feature.LORA,
    Feature.CLIP_SKIP,
}


def init_image() -> Any:
    from PIL import Image

    return Image.fromarray(np.full((32, 48, 3), 128, dtype=np.uint8))


def mask() -> np.ndarray:
    drawn = np.zeros((32, 48), dtype=np.uint8)
    drawn[8:24, 16:32] = 255
    return drawn


# feature -> (the request fields that ask for it, what the error says was asked)
ASKING: dict[Feature, tuple[Callable[[], dict[str, Any]], str]] = {
    Feature.MASK: (lambda: {"init_image": init_image(), "mask": mask()}, "inpainting (mask)"),
    Feature.CONTROLNET: (lambda: {"control": [(init_image(), "canny")]}, "ControlNet (control)"),
    Feature.HIRES: (lambda: {"enable_hr": True, "hr_scale": 2.0}, "hires fix (enable_hr=True)"),
    Feature.VAE_TILING: (lambda: {"vae_tiling": True, "vae_tile_size": 16}, "VAE tiling (vae_tiling=True)"),
    Feature.PROMPT_WEIGHTING: (lambda: {"prompt_weighting": "a1111"}, "A1111 prompt weighting (prompt_weighting)"),
    Feature.CLIP_SKIP: (lambda: {"clip_skip": 2}, "clip skip (clip_skip)"),
}


def asking(feature: Feature) -> dict[str, Any]:
    return ASKING[feature][0]()


def test_each_class_declares_its_features() -> None:
    assert StableDiffusionPipeline.features == SD_FEATURES
    assert StableDiffusionXLPipeline.features == SD_FEATURES | {Feature.REFINER}
    for cls in (StableDiffusion3Pipeline, FluxPipeline, ChromaPipeline):
        assert cls.features == {Feature.IMG2IMG, Feature.HIRES, Feature.VAE_TILING}, cls
    families = [
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
        StableDiffusion3Pipeline,
        FluxPipeline,
        ChromaPipeline,
    ]
    assert [cls.family_name for cls in families] == ["SD 1.x/2.x", "SDXL", "SD3", "FLUX.1", "Chroma"]


def test_defaults_ask_for_nothing() -> None:
    """What A1111 clients send by default (``enable_hr: false``...) asks for no feature."""
    quiet = GenerationRequest.create(
        "x", enable_hr=False, vae_tiling=False, control=[], mask=None, prompt_weighting="none", init_image=None
    )
    assert requested_features(quiet) == frozenset()
    assert requested_features(FlowRequest.create("x")) == frozenset()
    img2img = GenerationRequest.create("x", init_image=init_image())
    assert requested_features(img2img) == {Feature.IMG2IMG}
    inpaint = GenerationRequest.create("x", init_image=init_image(), mask=mask())
    assert requested_features(inpaint) == {Feature.IMG2IMG, Feature.MASK}
    for feature in ASKING:
        request = GenerationRequest.create("x", **asking(feature))
        assert feature in requested_features(request), feature


def test_the_error_names_every_missing_feature_and_the_family() -> None:
    with pytest.raises(UnsupportedFeatureError) as caught:
        refuse_undeclared({Feature.LORA, Feature.REFINER, Feature.IMG2IMG}, frozenset({Feature.IMG2IMG}), "Zeta")
    error = caught.value
    assert isinstance(error, InputError) and isinstance(error, SdkitError)
    assert error.family == "Zeta" and error.features == ("refiner", "LoRA")  # in Feature order
    assert str(error) == (
        "Zeta pipelines do not support refiner (refiner), LoRA (set_loras); they support: txt2img, img2img"
    )
    refuse_undeclared({Feature.IMG2IMG}, frozenset({Feature.IMG2IMG}), "Zeta")  # declared: nothing


@pytest.fixture(scope="module")
def flow_pipes() -> Any:
    if not (FLOW / "golden.json").is_file():
        pytest.skip("fixtures/tiny_flow missing")
    loaded = {name: sdkit.load_pipeline(FLOW / name, backend="reference", prepare=False) for name in FLOW_FAMILIES}
    yield loaded
    for pipe in loaded.values():
        pipe.close()


@pytest.mark.parametrize(
    "feature", [Feature.MASK, Feature.CONTROLNET, Feature.PROMPT_WEIGHTING, Feature.CLIP_SKIP], ids=lambda f: f.name
)
@pytest.mark.parametrize("name", list(FLOW_FAMILIES))
def test_flow_pipelines_refuse_what_they_do_not_declare(flow_pipes: Any, name: str, feature: Feature) -> None:
    """SD3, Flux and Chroma: a mask, ControlNet units and A1111 prompt weighting are refused by
    name, with the family, and nothing has compiled or run (VAE tiling and the hires fix they
    run: ``test_flow_vae_tiling.py``, ``test_flow_hires.py``)."""
    pipe = flow_pipes[name]
    _, said = ASKING[feature]
    with pytest.raises(UnsupportedFeatureError) as caught:
        pipe.generate("a photo", **SIZE, **asking(feature))
    text = str(caught.value)
    assert text.startswith(f"{FLOW_FAMILIES[name]} pipelines do not support {said};"), text
    assert text.endswith("they support: txt2img, img2img, hires fix, VAE tiling")
    assert caught.value.family == FLOW_FAMILIES[name]
    assert set(pipe.backends().values()) == {None}  # refused before anything compiled


@pytest.mark.parametrize("name", list(FLOW_FAMILIES))
def test_flow_pipelines_refuse_loras(flow_pipes: Any, name: str) -> None:
    """No LoRA on a flow family is checked against diffusers yet: ``set_loras`` refuses, by name;
    ``set_loras([])`` (none) is not a request for one."""
    pipe = flow_pipes[name]
    with pytest.raises(UnsupportedFeatureError, match=f"^{FLOW_FAMILIES[name]} pipelines do not support LoRA"):
        pipe.set_loras([("any.safetensors", 1.0)])


def test_the_command_line_refuses_in_one_line_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sdkit generate`` on an SD3 folder: ``--mask`` and ``--prompt-weighting a1111`` are each
    one line on stderr naming the feature and the family, exit 1."""
    from PIL import Image

    from sdkit.cli.main import main

    if not (FLOW / "golden.json").is_file():
        pytest.skip("fixtures/tiny_flow missing")
    image, drawn = tmp_path / "in.png", tmp_path / "mask.png"
    init_image().save(image)
    Image.fromarray(mask()).save(drawn)
    base = ["generate", "a photo", "--model", str(FLOW / "sd3"), "-o", str(tmp_path / "out.png")]
    base += ["--steps", "2", "--width", "48", "--height", "32", "--backend", "reference"]
    cases = {
        "inpainting (mask)": ["--init-image", str(image), "--mask", str(drawn)],
        "A1111 prompt weighting (prompt_weighting)": ["--prompt-weighting", "a1111"],
    }
    for said, flags in cases.items():
        capsys.readouterr()
        assert main([*base, *flags]) == 1
        err = without_progress(capsys.readouterr().err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"sdkit: error: SD3 pipelines do not support {said};"), err
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("name", list(FLOW_FAMILIES))
def test_flow_pipelines_refuse_a_refiner(flow_pipes: Any, name: str) -> None:
    """An SDXL request with a refiner handed to a flow pipeline: the refiner is named as an
    undeclared feature (not merely an unknown field), before anything runs."""
    from sdkit.pipelines.models.sdxl_request import XLRequest

    refiner_folder = FLOW.parent / "tiny_xl" / "sdxl_refiner"
    if not (refiner_folder / "model_index.json").is_file():
        pytest.skip("fixtures/tiny_xl missing")
    pipe = flow_pipes[name]
    refiner = sdkit.load_pipeline(refiner_folder, backend="reference", prepare=False)
    request = XLRequest.create("a photo", refiner=refiner, refiner_switch_at=0.5)
    with pytest.raises(UnsupportedFeatureError, match=f"^{FLOW_FAMILIES[name]} pipelines do not support refiner"):
        pipe.run(request)
    assert set(pipe.backends().values()) == {None}


def test_sd_pipelines_refuse_a_refiner() -> None:
    """SD 1.x/2.x declares no refiner: an SDXL request with one is refused by the feature's name."""
    from sdkit.pipelines.models.sdxl_request import XLRequest

    tiny_xl = FLOW.parent / "tiny_xl"
    if not (tiny_xl / "sd15" / "model_index.json").is_file():
        pytest.skip("fixtures/tiny_xl missing")
    sd15 = sdkit.load_pipeline(tiny_xl / "sd15", backend="reference", prepare=False)
    refiner = sdkit.load_pipeline(tiny_xl / "sdxl_refiner", backend="reference", prepare=False)
    request = XLRequest.create("a photo", refiner=refiner, refiner_switch_at=0.5)
    with pytest.raises(UnsupportedFeatureError, match=r"^SD 1.x/2.x pipelines do not support refiner \(refiner\);"):
        sd15.run(request)
    assert set(sd15.backends().values()) == {None}
