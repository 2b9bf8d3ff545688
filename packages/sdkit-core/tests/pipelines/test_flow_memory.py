"""The flow pipelines' memory: which components are resident at each stage under ``keep`` and
``offload`` (observed through weak references to each component's loaded weights and compiled
model, not timed), and component folders whose weights are external data (optimum's
``model.onnx_data``, older diffusers exports' ``weights.pb``).

Oracle for the external-data folders: the same pipeline with the weights inside each
``model.onnx`` (bit-identical weights: images within 1e-6) and diffusers' golden image
(``fixtures/tiny_flow``, 1e-3 on [0, 1] pixels), on the reference backend.
"""

from __future__ import annotations

import json
import shutil
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import sdkit
from sdkit.model import Model
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.sources import ModelSource

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
pytestmark = pytest.mark.skipif(not (ROOT / "golden.json").is_file(), reason="fixtures/tiny_flow missing")
FAMILIES = ("sd3", "flux_dev", "chroma")
# The transformer's stage is the denoising loop; the text encoders come before it, the VAE after.
STAGES = {
    "sd3": ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae_decoder"),
    "flux_dev": ("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
    "chroma": ("text_encoder", "transformer", "vae_decoder"),
}
REQUEST = {"seed": 1, "steps": 2, "width": 48, "height": 32, "max_sequence_length": 32, "output_type": "np"}


@dataclass
class Residency:
    """Weak references to what each component loaded (its WeightSet) and compiled; at every
    compile, the components whose weights or compiled model are still alive."""

    weights: dict[str, list[weakref.ref[Any]]] = field(default_factory=dict)
    compiled: dict[str, list[weakref.ref[Any]]] = field(default_factory=dict)
    log: list[tuple[str, frozenset[str]]] = field(default_factory=list)  # (compiling, others resident)

    def resident(self) -> frozenset[str]:
        alive = {
            name
            for table in (self.weights, self.compiled)
            for name, refs in table.items()
            if any(ref() is not None for ref in refs)
        }
        return frozenset(alive)


@dataclass(frozen=True)
class TrackedSource:
    """A component's source that records a weak reference to each Model's weights it hands out."""

    inner: ModelSource
    name: str
    residency: Residency

    def describe(self) -> str:
        return self.inner.describe()

    def load(self) -> Model:
        model = self.inner.load()
        self.residency.weights.setdefault(self.name, []).append(weakref.ref(model.weights))
        return model


def track(pipe: Any, monkeypatch: pytest.MonkeyPatch) -> Residency:
    """Release every component, then observe each later load and compile."""
    residency = Residency()
    for name, component in pipe.components.items():
        component.release()
        component.source = TrackedSource(component.source, name, residency)
    compile_component: Callable[[Component, Model], Any] = Component._compile

    def tracked_compile(self: Component, model: Model) -> Any:
        residency.log.append((self.name, residency.resident() - {self.name}))
        # the model compiled is the loaded one with unread outputs pruned: its own weight set
        residency.weights[self.name].append(weakref.ref(model.weights))
        compiled = compile_component(self, model)
        residency.compiled.setdefault(self.name, []).append(weakref.ref(compiled))
        return compiled

    monkeypatch.setattr(Component, "_compile", tracked_compile)
    return residency


@pytest.mark.parametrize("family", FAMILIES)
def test_offload_holds_one_component_at_a_time(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``offload`` each stage compiles its component with nothing else resident: T5, the
    transformer and the VAE never sit in memory together; nothing is left once the image is made."""
    pipe = sdkit.load_pipeline(ROOT / family, backend="reference", memory="offload")
    residency = track(pipe, monkeypatch)
    steps: list[frozenset[str]] = []
    pipe.generate("a cat", **REQUEST, callback=lambda i, n, x: steps.append(residency.resident()))
    order = [name for name, _ in residency.log]
    assert order == list(STAGES[family])  # each component compiled once, in pipeline order
    assert all(not others for _, others in residency.log), residency.log
    assert steps == [frozenset({"transformer"})] * REQUEST["steps"]  # only the transformer while denoising
    assert residency.resident() == frozenset()


def test_offload_img2img_adds_the_encoder_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """img2img under ``offload``: the VAE encoder is a stage of its own, after the text encoders
    and before the transformer, with nothing else resident when it compiles."""
    from PIL import Image

    pipe = sdkit.load_pipeline(ROOT / "flux_dev", backend="reference", memory="offload")
    residency = track(pipe, monkeypatch)
    image = Image.fromarray(np.full((32, 48, 3), 128, np.uint8))
    pipe.generate("a cat", **REQUEST, init_image=image, strength=0.5)
    assert [name for name, _ in residency.log] == [
        "text_encoder",
        "text_encoder_2",
        "vae_encoder",
        *STAGES["flux_dev"][2:],
    ]
    assert all(not others for _, others in residency.log), residency.log
    assert residency.resident() == frozenset()


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_holds_every_component(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast that shows the observation sees residency: under ``keep`` every component
    compiled so far stays, and all of them are resident after the image."""
    pipe = sdkit.load_pipeline(ROOT / family, backend="reference", memory="keep")
    residency = track(pipe, monkeypatch)
    pipe.generate("a cat", **REQUEST)
    stages = STAGES[family]
    assert residency.log == [(name, frozenset(stages[:i])) for i, name in enumerate(stages)]
    assert residency.resident() == frozenset(stages)
    pipe.close()
    assert residency.resident() == frozenset()


def _externalize(folder: Path, location: str | None) -> None:
    """Re-save every component's ``model.onnx`` with all its initializers as external data:
    ``location`` one file per component (``model.onnx_data``, ``weights.pb``), ``None`` one
    file per tensor (``onnx``'s ``all_tensors_to_one_file=False``)."""
    for path in sorted(folder.glob("*/model.onnx")):
        proto = onnx.load_model(str(path))
        onnx.save_model(
            proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=location is not None,
            location=location,
            size_threshold=0,
        )
        stored = onnx.load_model(str(path), load_external_data=False).graph.initializer
        assert stored and all(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)


@pytest.fixture(scope="module")
def golden_images() -> dict[str, np.ndarray]:
    with np.load(ROOT / "golden.npz") as data:
        return {key: data[f"{key}/image"] for key in ("sd3_cfg", "flux_dev", "chroma_cfg")}


def _golden_request(key: str) -> tuple[str, dict[str, Any]]:
    meta = json.loads((ROOT / "golden.json").read_text(encoding="utf-8"))
    c = next(c for c in meta["cases"] if c["key"] == key)
    keys = ("seed", "steps", "guidance_scale", "width", "height", "max_sequence_length")
    return c["prompt"], {
        "negative_prompt": c["negative_prompt"] or "",
        **{k: c[k] for k in keys},
        "output_type": "np",
    }


@pytest.mark.parametrize(
    ("family", "key", "location"),
    [
        ("sd3", "sd3_cfg", "model.onnx_data"),  # optimum's layout
        ("flux_dev", "flux_dev", "model.onnx_data"),
        ("chroma", "chroma_cfg", "model.onnx_data"),
        ("flux_dev", "flux_dev", "weights.pb"),  # diffusers' older ONNX exports
        ("flux_dev", "flux_dev", None),  # one file per tensor
    ],
)
def test_external_data_folders(
    tmp_path: Path, golden_images: dict[str, np.ndarray], family: str, key: str, location: str | None
) -> None:
    folder = tmp_path / family
    shutil.copytree(ROOT / family, folder)
    _externalize(folder, location)
    prompt, request = _golden_request(key)
    pipe = sdkit.load_pipeline(folder, backend="reference", memory="offload")
    image = pipe.generate(prompt, **request)
    inside = sdkit.load_pipeline(ROOT / family, backend="reference", memory="offload").generate(prompt, **request)
    assert float(np.abs(image - inside).max()) <= 1e-6
    assert float(np.abs(image - golden_images[key]).max()) <= 1e-3


def test_missing_external_data_is_one_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "flux_dev"
    shutil.copytree(ROOT / "flux_dev", folder)
    _externalize(folder, "model.onnx_data")
    (folder / "transformer" / "model.onnx_data").unlink()
    with pytest.raises(sdkit.errors.ModelFormatError, match=r"transformer/model\.onnx.*model\.onnx_data"):
        sdkit.load_pipeline(folder, backend="reference", memory="keep")  # keep loads every component now
