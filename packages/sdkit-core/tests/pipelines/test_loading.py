"""load_pipeline dispatches through the model-loader registry: a plugin's pipeline loader plugs
in by registering (what a single-file checkpoint loader will do), and refusals say why."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdkit
from sdkit import plugins as plugins_module
from sdkit.errors import ModelFormatError
from sdkit.plugins import Plugins

PLUGIN = """
import dataclasses
from pathlib import Path

from sdkit.pipelines import PipelineLoader, StableDiffusionPipeline
from sdkit.pipelines.loaders.diffusers_folder import folder_config, folder_sources, read_folder
from sdkit.plugins import hookimpl


class PointerFileLoader(PipelineLoader):
    '''A ``.pointer`` text file naming a pipeline folder: config and sources come from elsewhere.'''

    name = "pointer-file"
    priority = 30

    def sniff(self, path):
        return path.suffix == ".pointer" and path.is_file()

    def explain(self, path):
        return f"{path.name} is not a .pointer file"

    def build(self, path, settings):
        layout = read_folder(Path(path.read_text().strip()))
        config = dataclasses.replace(folder_config(layout), name=path.stem)
        names = StableDiffusionPipeline.component_names
        return StableDiffusionPipeline(config, settings.components(names, folder_sources(layout), config.text_outputs))


@hookimpl
def sdkit_register_model_loaders(registry):
    registry.add(PointerFileLoader)
"""


@pytest.fixture
def pointer_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("fake_pointer_plugin")
    exec(textwrap.dedent(PLUGIN), module.__dict__)
    sys.modules[module.__name__] = module
    loaded = Plugins([importlib.metadata.EntryPoint("pointer", module.__name__, "sdkit")])
    assert not loaded.failures
    monkeypatch.setattr(plugins_module.manager, "_plugins", loaded)
    yield
    sys.modules.pop(module.__name__, None)


@pytest.mark.usefixtures("pointer_plugin")
def test_a_registered_pipeline_loader_is_used(tiny_dir: Path, tmp_path: Path) -> None:
    pointer = tmp_path / "my-model.pointer"
    pointer.write_text(str(tiny_dir))
    pipe = sdkit.load_pipeline(pointer, backend="reference")
    assert pipe.name == "my-model"
    assert all(pipe.components[c].compiled is not None for c in ("text_encoder", "unet", "vae_decoder"))  # keep
    [image] = pipe.generate("a cat", seed=0, width=32, height=32, steps=1, guidance_scale=1.0)
    assert "Model: my-model," in image.info["parameters"]
    assert isinstance(sdkit.load_model(pointer, backend="reference", memory="offload"), sdkit.pipelines.Pipeline)
    # the folder loader is still there, at its own priority
    assert sdkit.load_pipeline(tiny_dir, backend="reference", memory="offload").name == "model"


@pytest.mark.usefixtures("pointer_plugin")
def test_no_loader_takes_it_each_says_why(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(ModelFormatError) as info:
        sdkit.load_pipeline(other)
    text = str(info.value)
    assert "pointer-file: notes.txt is not a .pointer file" in text
    assert "diffusers-onnx:" in text and "not a pipeline folder" in text


def test_refusals_before_any_loader(tmp_path: Path) -> None:
    pickled = tmp_path / "v1-5.ckpt"
    pickled.write_bytes(b"not really a pickle")
    with pytest.raises(ModelFormatError, match="pickled checkpoints are refused"):
        sdkit.load_pipeline(pickled)
    with pytest.raises(ModelFormatError, match="pipeline not found"):
        sdkit.load_pipeline(tmp_path / "missing")
