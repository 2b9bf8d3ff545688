"""A family a plugin registers (``sdkit_register_model_families``) loads from a single file and
from a diffusers ONNX folder through the one family registry: its ``Family`` (graphs, probes,
defaults, ``FolderSpec``) and its own pipeline class, nothing registered anywhere else.

The test plugin registers two: the tiny SD 1.x family under another name, with a folder spec that
claims folders whose ``model_index.json`` names ``PluginDiffusionPipeline`` and a pipeline class of
its own (a ``StableDiffusionPipeline`` subclass), and FLUX.1 dev under another name claiming
``PluginFluxPipeline`` folders (a ``FluxPipeline`` subclass; ranked above the built-in Flux spec,
which claims the name too). Oracles: diffusers' images of the same weights
(``fixtures/tiny_pipeline/golden.npz`` for the SD folder, ``StableDiffusionPipeline.from_single_file``
in ``fixtures/families/tiny/sd1/goldens.npz`` for the file, ``FluxPipeline`` in
``fixtures/tiny_flow/golden.npz`` for the Flux folder), max |diff| <= 1e-3 on [0, 1] pixels, on the
reference backend.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.families import Family
from sdkit.families.builtin import SD_FOLDER
from sdkit.families.flux import FLUX_DEV, FLUX_FOLDER
from sdkit.pipelines.loaders.diffusers_folder import folder_config, read_folder
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.pipelines.models.stable_diffusion import StableDiffusionPipeline
from sdkit.plugins import Plugins, manager
from sdkit.testing.goldens import GoldenSet

TINY_SD1 = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd1"
TOLERANCE = 1e-3
MODULE = "sdkit_test_plugin_family"
CLASS_NAME = "PluginDiffusionPipeline"
# The plugin's hook module, as a third party would write it: the family object and its pipeline
# class, registered through the hook; the family names its class by "module:attr" reference.
PLUGIN = f"""
from sdkit.pipelines.models.flux import FluxPipeline
from sdkit.pipelines.models.stable_diffusion import StableDiffusionPipeline
from sdkit.plugins import hookimpl

class PluginSdPipeline(StableDiffusionPipeline):
    '''The plugin SD family's own pipeline class (SD's stages).'''

class PluginFluxPipeline(FluxPipeline):
    '''The plugin flow family's own pipeline class (Flux's stages).'''

FAMILY = None  # set by the test: the tiny SD 1.x family renamed, with its FolderSpec
FLOW_FAMILY = None  # FLUX.1 dev renamed, claiming PluginFlux folders

@hookimpl
def sdkit_register_model_families(registry):
    registry.add("{MODULE}:FAMILY")
    registry.add("{MODULE}:FLOW_FAMILY")
"""
FLUX_CLASS_NAME = "PluginFluxPipeline"  # "Flux" in it: the built-in Flux spec claims it too, at a lower rank


@pytest.fixture
def plugin_family(tiny_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch) -> Iterator[Family]:
    """The installed plugins plus the test plugin (entry point ``plugin-family``) as the
    process-wide plugin set; the tiny families plugin is not among them, so a tiny SD 1.x file
    matches the plugin's family alone."""
    module = types.ModuleType(MODULE)
    exec(textwrap.dedent(PLUGIN), module.__dict__)
    folder = replace(SD_FOLDER, class_names=(CLASS_NAME,), rank=50)
    family = replace(
        tiny_families["sd1"], name="plugin_sd", label="plugin SD", pipeline=f"{MODULE}:PluginSdPipeline", folder=folder
    )
    module.FAMILY = family  # type: ignore[attr-defined]
    flow_folder = replace(FLUX_FOLDER, class_names=(FLUX_CLASS_NAME,), rank=60)
    module.FLOW_FAMILY = replace(  # type: ignore[attr-defined]
        FLUX_DEV, name="plugin_flux", label="plugin Flux", pipeline=f"{MODULE}:PluginFluxPipeline", folder=flow_folder
    )
    sys.modules[MODULE] = module
    entry = importlib.metadata.EntryPoint(name="plugin-family", value=MODULE, group="sdkit")
    plugins = Plugins([*importlib.metadata.entry_points(group="sdkit"), entry])
    assert not [f for f in plugins.failures if f.name == "plugin-family"], plugins.failures
    assert plugins.families.owner("plugin_sd") == "plugin-family"
    monkeypatch.setattr(manager, "_plugins", plugins)
    yield family
    sys.modules.pop(MODULE, None)


def _plugin_folder(tiny_dir: Path, tmp_path: Path) -> Path:
    """The tiny SD pipeline folder with a ``model_index.json`` that names the plugin's class."""
    folder = tmp_path / "plugin-model"
    shutil.copytree(tiny_dir, folder)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    index["_class_name"] = CLASS_NAME
    (folder / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    return folder


def test_a_plugin_family_loads_from_a_folder(
    plugin_family: Family,
    tiny_dir: Path,
    tmp_path: Path,
    golden: dict[str, np.ndarray],
    meta: dict[str, Any],
    case_kwargs: Any,
) -> None:
    folder = _plugin_folder(tiny_dir, tmp_path)
    layout = read_folder(folder)
    assert layout.family is plugin_family
    cls = pipeline_class_for(folder)
    assert cls is not None and cls.__name__ == "PluginSdPipeline" and cls.__module__ == MODULE
    pipe = sdkit.load_pipeline(folder, backend="reference")
    assert type(pipe) is cls
    case = meta["cases"][0]
    assert case["sampler"] == "euler" and case["mode"] == "txt2img"
    image = pipe.generate(case["prompt"], **case_kwargs(case, golden))
    assert np.abs(image - golden[f"{case['key']}_image"]).max() <= TOLERANCE
    # The built-in SD family still reads the folder the plugin does not claim.
    assert pipeline_class_for(tiny_dir) is StableDiffusionPipeline


def test_a_plugin_flow_family_loads_from_a_folder(plugin_family: Family, tmp_path: Path) -> None:
    """A flow family under a new name: the tiny FLUX.1 dev folder whose model_index.json names
    the plugin's class gives diffusers' FluxPipeline image (``fixtures/tiny_flow``, case
    ``flux_dev``) through the plugin's pipeline class."""
    flow = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
    goldens = GoldenSet(flow)
    if goldens.missing:
        pytest.skip("fixtures/tiny_flow missing")
    folder = tmp_path / "plugin-flux"
    shutil.copytree(flow / "flux_dev", folder)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    index["_class_name"] = FLUX_CLASS_NAME
    (folder / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    assert read_folder(folder).family.name == "plugin_flux"
    pipe = sdkit.load_pipeline(folder, backend="reference")
    assert type(pipe).__name__ == "PluginFluxPipeline" and type(pipe).__module__ == MODULE
    c = goldens.case("flux_dev")
    keys = ("seed", "steps", "guidance_scale", "width", "height", "max_sequence_length")
    image = pipe.generate(
        c["prompt"], negative_prompt=c["negative_prompt"] or "", output_type="np", **{k: c[k] for k in keys}
    )
    assert np.abs(image - goldens.array("flux_dev/image")).max() <= TOLERANCE


def test_a_plugin_family_loads_from_a_single_file(plugin_family: Family) -> None:
    pipe = sdkit.load_pipeline(TINY_SD1 / "sd1_fp16.safetensors", backend="reference")
    assert type(pipe).__name__ == "PluginSdPipeline"
    assert pipe.checkpoint is not None and pipe.checkpoint.family is plugin_family
    with np.load(TINY_SD1 / "goldens.npz", allow_pickle=False) as data:
        expected = data["sd1_fp16/txt2img/image"]
    request = json.loads((TINY_SD1 / "goldens.json").read_text(encoding="utf-8"))
    case = request["families"]["sd1"]["files"]["sd1_fp16"]["txt2img"]
    assert case["sampler"] == "EulerDiscreteScheduler"
    image = pipe.generate(
        case["prompt"],
        negative_prompt=case["negative_prompt"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        width=case["width"],
        height=case["height"],
        seed=case["seed"],
        sampler="euler",
        output_type="np",
    )
    assert np.abs(image - expected).max() <= TOLERANCE


def test_without_the_plugin_the_folder_is_an_sd_folder(tiny_dir: Path, tmp_path: Path) -> None:
    """Only the registered families decide: with the plugin absent, SD's fallback spec reads it."""
    folder = _plugin_folder(tiny_dir, tmp_path)
    assert read_folder(folder).family.name == "sd1"
    assert pipeline_class_for(folder) is StableDiffusionPipeline


def test_a_claimed_variant_is_refused_by_name(tiny_dir: Path, tmp_path: Path) -> None:
    """A class name the claiming family's spec refuses (Flux's Fill variant) is one clear error."""
    folder = _plugin_folder(tiny_dir, tmp_path)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    index["_class_name"] = "FluxFillPipeline"
    (folder / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(ModelFormatError, match=r"FluxFillPipeline is not a supported pipeline.*'Fill'"):
        read_folder(folder)


def test_a_folder_silent_on_a_value_takes_its_familys(tmp_path: Path) -> None:
    """An SDXL folder without VAE and UNet config.json files: SDXL's published VAE scaling
    (0.13025) and sample size (128: 1024 px), not SD 1.x's; a Flux folder's: Flux's factors."""
    fixtures = Path(__file__).resolve().parents[4] / "fixtures"
    for name, source in (("sdxl", fixtures / "tiny_xl" / "sdxl"), ("flux", fixtures / "tiny_flow" / "flux_dev")):
        if not source.is_dir():
            pytest.skip(f"{source} missing")
        folder = tmp_path / name
        shutil.copytree(source, folder)
        for component in ("unet", "transformer", "vae_decoder", "vae_encoder"):
            (folder / component / "config.json").unlink(missing_ok=True)
        config = folder_config(read_folder(folder))
        if name == "sdxl":
            assert (config.vae_scaling_factor, config.sample_size, config.default_size) == (0.13025, 128, 1024)
            assert config.fp32_components == ("vae_decoder", "vae_encoder")
        else:
            assert (config.vae_scaling_factor, config.vae_shift_factor, config.patch_size) == (0.3611, 0.1159, 2)
            assert (config.latent_channels, config.prediction_type) == (16, "flow")
