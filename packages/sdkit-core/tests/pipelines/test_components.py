"""Components take their model from a source and swap weights: refit where the backend can,
else recompile on the next use. Oracle: numpy's matmul."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.errors import InputError, OptionError
from sdkit.pipelines import Component, LoadSettings, ModelInMemory, ModelSource, OnnxFileSource
from sdkit.testing import one_node_model

X = np.arange(6, dtype=np.float32).reshape(2, 3)
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
W2 = (W * 3 + 1).astype(np.float32)


def _component(policy: str = "keep") -> Component:
    model = one_node_model("MatMul", {"x": X}, initializers={"w": W})
    return Component("matmul", ModelInMemory(model, "matmul"), backend="reference", policy=policy)  # type: ignore[arg-type]


def _run(component: Component) -> np.ndarray:
    return component.run({"x": X})["out0"]


def test_sources_are_model_providers(tiny_dir: Path) -> None:
    source = OnnxFileSource(tiny_dir / "unet" / "model.onnx")
    assert isinstance(source, ModelSource)
    assert source.describe() == "unet/model.onnx"
    assert {i.name for i in source.load().inputs} == {"sample", "timestep", "encoder_hidden_states"}


def test_refit_in_place_where_the_backend_can() -> None:
    component = _component()
    np.testing.assert_allclose(_run(component), X @ W, rtol=1e-6)
    compiled = component.compiled
    assert component.set_weights({"w": W2}) == "refit"
    assert component.compiled is compiled  # the same engine, new weights
    np.testing.assert_allclose(_run(component), X @ W2, rtol=1e-6)
    assert component.set_weights(None) == "refit"  # back to the source's own
    np.testing.assert_allclose(_run(component), X @ W, rtol=1e-6)


def test_recompile_where_the_backend_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    component = _component()
    _run(component)
    assert component.compiled is not None

    def cannot(weights: Any) -> None:
        raise NotImplementedError("this engine cannot refit")

    monkeypatch.setattr(component.compiled, "refit", cannot)
    assert component.set_weights({"w": W2}) == "recompile"
    assert component.compiled is None  # released now; the next use compiles with W2
    np.testing.assert_allclose(_run(component), X @ W2, rtol=1e-6)
    assert component.compiled is not None


def test_a_failed_refit_releases_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    component = _component()
    _run(component)

    def broken(weights: Any) -> None:
        raise InputError("refit: dtype mismatch")

    monkeypatch.setattr(component.compiled, "refit", broken)
    with pytest.raises(InputError, match="dtype mismatch"):
        component.set_weights({"w": W2})
    assert component.compiled is None


def test_offload_and_not_yet_compiled_take_effect_on_the_next_compile() -> None:
    offload = _component("offload")
    assert offload.set_weights({"w": W2}) == "recompile"
    np.testing.assert_allclose(_run(offload), X @ W2, rtol=1e-6)
    assert offload.compiled is None
    fresh = _component()
    assert fresh.set_weights({"nope": W2}) == "recompile"
    with pytest.raises(InputError, match="weight 'nope' is not in the model"):
        _run(fresh)
    fresh.set_weights({"w": W2[:2]})
    with pytest.raises(InputError, match="shape"):
        _run(fresh)


def test_load_settings_are_checked_once_and_make_components() -> None:
    with pytest.raises(OptionError, match="memory policy"):
        LoadSettings.create(memory="sometimes")
    settings = LoadSettings.create(backend={"unet": "reference", "default": "auto"}, threads=2)
    sources = {"unet": ModelInMemory(one_node_model("Relu", {"x": X}))}
    [unet] = settings.components(("text_encoder", "unet"), sources, {"unet": ("out0",)}).values()
    assert (unet.name, unet.backend, unet.policy, unet.outputs) == ("unet", "reference", "keep", ("out0",))
    assert dict(unet.options or {}) == {"threads": 2}
    with pytest.raises(OptionError, match="component 'vae'"):
        LoadSettings.create(backend={"vae": "reference"}).components(("unet",), sources)


def test_a_new_source_refits_the_same_graph_and_recompiles_another() -> None:
    """``set_source`` (another checkpoint of the family): the same graph is refit in place and
    weights set before are dropped; a different graph is compiled anew on the next use."""
    component = _component()
    _run(component)
    compiled = component.compiled
    component.set_weights({"w": W})
    same_graph = one_node_model("MatMul", {"x": X}, initializers={"w": W2})
    assert component.set_source(ModelInMemory(same_graph, "other")) == "refit"
    assert component.compiled is compiled
    np.testing.assert_allclose(_run(component), X @ W2, rtol=1e-6)
    other_graph = one_node_model("MatMul", {"x": X}, initializers={"w": W2[:, :2]})
    assert component.set_source(ModelInMemory(other_graph, "smaller")) == "recompile"
    assert component.compiled is None
    np.testing.assert_allclose(_run(component), X @ W2[:, :2], rtol=1e-6)
