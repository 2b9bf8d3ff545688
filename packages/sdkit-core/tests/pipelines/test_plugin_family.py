"""A family a plugin registers (``sdkit_register_model_families``) loads from a single file and
from a diffusers ONNX folder through the one family registry: its ``Family`` (graphs, probes,
defaults, ``FolderSpec``) and its own pipeline class, nothing registered anywhere else.

The test plugin's family is the tiny SD 1.x family under another name, with a folder spec that
claims folders whose ``model_index.json`` names ``PluginDiffusionPipeline`` and a pipeline class of
its own (a ``StableDiffusionPipeline`` subclass). Oracles: diffusers' images of the same weights
(``fixtures/tiny_pipeline/golden.npz`` for the folder, ``StableDiffusionPipeline.from_single_file``
in ``fixtures/families/tiny/sd1/goldens.npz`` for the file), max |diff| <= 1e-3 on [0, 1] pixels,
on the reference backend.
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
from sdkit.pipelines.diffusers_folder import folder_config, read_folder
from sdkit.pipelines.loading import pipeline_class_for
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.plugins import Plugins, manager

TINY_SD1 = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd1"
TOLERANCE = 1e-3
MODULE = "sdkit_test_plugin_family"
CLASS_NAME = "PluginDiffusionPipeline"
# The plugin's hook module, as a third party would write it: the family object and its pipeline
# class, registered through the hook; the family names its class by "module:attr" reference.
PLUGIN = f"""
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.plugins import hookimpl

class PluginSdPipeline(StableDiffusionPipeline):
    '''The plugin family's own pipeline class (SD's stages).'''

FAMILY = None  # set by the test: the tiny SD 1.x family renamed, with its FolderSpec

@hookimpl
def sdkit_register_model_families(registry):
    registry.add("{MODULE}:FAMILY")
"""


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
