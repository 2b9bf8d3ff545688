"""Shared fixtures: every core test runs isolated; the tiny model families (``tiny_families``)
are registered through ``sdkit_register_model_families`` like any plugin's.

A tiny family is built by ``sdkit.families.sd_family`` from its fixture folder's diffusers
configs (``fixtures/families/tiny/<family>/config/{unet,vae,text_encoder*}/config.json``): its
graphs are the tiny weightless ones, its tokenizers the tiny BPE folders, its scheduler config the
folder's ``scheduler_config.json`` (the "published" config of a tiny family).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sdkit.families import Family, TextEncoderArch, sd_family
from sdkit.plugins import Plugins, hookimpl, manager


@pytest.fixture(autouse=True)
def _isolated(sdkit_isolated: Path) -> Path:
    """Every core test runs with fresh plugins, probes and a private artifact cache."""
    return sdkit_isolated


FAMILIES = Path(__file__).resolve().parents[3] / "fixtures" / "families"
TINY = FAMILIES / "tiny"

# (component, kind, LDM prefix) per tiny family, as each file's LDM/SGM layout has them.
TEXT_ENCODERS: dict[str, list[tuple[str, str, str]]] = {
    "sd1": [("text_encoder", "clip", "cond_stage_model.transformer.")],
    "sd1_inpaint": [("text_encoder", "clip", "cond_stage_model.transformer.")],
    "sd2v": [("text_encoder", "openclip", "cond_stage_model.model.")],
    "sdxl": [
        ("text_encoder", "clip", "conditioner.embedders.0.transformer."),
        ("text_encoder_2", "openclip", "conditioner.embedders.1.model."),
    ],
    "sdxl_refiner": [("text_encoder_2", "openclip", "conditioner.embedders.0.model.")],
}
PIPELINES = {
    "sdxl": "sdkit.pipelines.models.sdxl:StableDiffusionXLPipeline",
    "sdxl_refiner": "sdkit.pipelines.models.sdxl:StableDiffusionXLPipeline",
}


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _text_outputs(family: str, encoders: list[TextEncoderArch]) -> dict[str, tuple[str, ...]]:
    if not family.startswith("sdxl"):
        return {"text_encoder": ("last_hidden_state",)}
    outputs: dict[str, tuple[str, ...]] = {}
    for encoder in encoders:
        extra = ("text_embeds",) if encoder.projection_dim else ()
        outputs[encoder.component] = (f"hidden_states.{encoder.layers - 1}", *extra)
    return outputs


def tiny_family(family: str) -> Family:
    """The tiny ``family`` (``sd1``, ``sd2v``, ``sd1_inpaint``, ``sdxl``, ``sdxl_refiner``),
    named ``tiny_<family>``."""
    folder = TINY / family
    config = folder / "config"
    encoders = []
    for component, kind, prefix in TEXT_ENCODERS[family]:
        text = _json(config / component / "config.json")
        projection = text["projection_dim"] if component == "text_encoder_2" else None
        encoders.append(
            TextEncoderArch(
                component,
                folder / "graphs" / f"{component}.onnx",
                kind,
                prefix,
                text["hidden_size"],
                text["num_hidden_layers"],
                text["vocab_size"],
                projection,
            )
        )
    tokenizers = {e.component: config / e.component.replace("text_encoder", "tokenizer") for e in encoders}
    scheduler = _json(config / "scheduler" / "scheduler_config.json")
    return sd_family(
        f"tiny_{family}",
        f"tiny {family}",
        unet_graph=folder / "graphs" / "unet.onnx",
        unet_config=_json(config / "unet" / "config.json"),
        text_encoders=tuple(encoders),
        vae_config=_json(config / "vae" / "config.json"),
        scheduler_config=scheduler,
        tokenizers=tokenizers,
        text_outputs=_text_outputs(family, encoders),
        prediction_type=scheduler.get("prediction_type", "epsilon"),
        pipeline=PIPELINES.get(family, "sdkit.pipelines.models.stable_diffusion:StableDiffusionPipeline"),
        vae_graphs=(folder / "graphs" / "vae_encoder.onnx", folder / "graphs" / "vae_decoder.onnx"),
        xl=family.startswith("sdxl"),
    )


def tiny_families_by_name() -> dict[str, Family]:
    """The five tiny families, plus ``sd2``: the sd2v files read as epsilon models at a lower
    priority, as the built-in SD 2.x 512-eps and 768-v families share their files."""
    if not (TINY / "sd1").is_dir():
        return {}
    found = {name: tiny_family(name) for name in ("sd1", "sd2v", "sd1_inpaint", "sdxl", "sdxl_refiner")}
    sd2v = replace(found["sd2v"], priority=1)
    scheduler = {**(sd2v.scheduler_config or {}), "prediction_type": "epsilon"}
    found["sd2v"] = sd2v
    found["sd2"] = replace(sd2v, name="tiny_sd2", label="tiny sd2 (eps)", prediction_type="epsilon", priority=0)
    found["sd2"] = replace(found["sd2"], scheduler_config=scheduler)
    return found


TINY_FAMILIES = tiny_families_by_name()


@hookimpl
def sdkit_register_model_families(registry: Any) -> None:
    """The tiny families, registered as a plugin registers its own."""
    for family in TINY_FAMILIES.values():
        registry.add(family)


# The plugin's entry point names this module; pytest imports conftest files under a path-derived
# name that is no valid module name, so it is published under this one too.
PLUGIN_MODULE = "sdkit_tests_tiny_families"
sys.modules.setdefault(PLUGIN_MODULE, sys.modules[__name__])


@pytest.fixture
def tiny_families(monkeypatch: pytest.MonkeyPatch) -> dict[str, Family]:
    """The installed plugins plus this module as the plugin ``tiny-families``, as the
    process-wide plugin set for one test."""
    if not TINY_FAMILIES:
        pytest.skip(f"the tiny family fixtures are missing ({TINY})")
    entry = importlib.metadata.EntryPoint(name="tiny-families", value=PLUGIN_MODULE, group="sdkit")
    installed = list(importlib.metadata.entry_points(group="sdkit"))
    plugins = Plugins([*installed, entry])
    assert not [f for f in plugins.failures if f.name == "tiny-families"], plugins.failures
    monkeypatch.setattr(manager, "_plugins", plugins)
    return TINY_FAMILIES


# -- backends with injected run times, for the measured choice (sdkit.tuning) -----------------


class FakeClock:
    """A clock only the fake backends advance: each run of a ``Timed`` backend takes its
    ``cost`` seconds, so which backend is fastest is set by the test, never by the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedPlugins:
    """What the ``timed_plugins`` fixture gives a test: the clock, each backend's compile count,
    and the fake backends' run costs (seconds) and output scales (1.0: right)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.compiles: dict[str, int] = {}
        self.cost = {"slowhigh": 3.0, "fastlow": 1.0, "wrong": 0.5}
        self.scale = {"slowhigh": 1.0, "fastlow": 1.0, "wrong": -1.0}
        self.fail: set[str] = set()  # backends whose compile raises (a plugin's bug)


@pytest.fixture
def timed_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[TimedPlugins]:
    """Three fake backends on top of the reference backend: ``wrong`` (priority 95, fastest, and
    its outputs are negated), ``slowhigh`` (priority 90, 3 s a run), ``fastlow`` (priority 40,
    1 s a run); plus ``reference`` itself (priority 0, a fallback; runs take no fake time)."""
    import importlib.metadata
    import sys
    import types
    from typing import ClassVar

    import numpy as np

    from sdkit import plugins as plugins_module
    from sdkit.backend import CompiledModel
    from sdkit.plugins import Plugins, hookimpl
    from sdkit.reference import ReferenceBackend

    state = TimedPlugins()

    class Costly(CompiledModel):
        def __init__(self, inner: CompiledModel, name: str) -> None:
            self.inputs, self.outputs, self.device = inner.inputs, inner.outputs, inner.device
            self._inner, self._name = inner, name

        def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            state.clock.now += state.cost[self._name]
            out = self._inner.execute(feeds)
            return {k: v * np.asarray(state.scale[self._name], v.dtype) for k, v in out.items()}

    def timed(backend_name: str, backend_priority: int) -> type[ReferenceBackend]:
        class Timed(ReferenceBackend):
            name: ClassVar[str] = backend_name
            priority: ClassVar[int] = backend_priority

            def compile(self, graph: Any, weights: Any, device: Any, options: Any) -> CompiledModel:
                state.compiles[self.name] = state.compiles.get(self.name, 0) + 1
                if self.name in state.fail:
                    raise RuntimeError("plugin bug")
                return Costly(super().compile(graph, weights, device, options), self.name)

        return Timed

    module = types.ModuleType("fake_timed_plugin")
    classes = [timed("wrong", 95), timed("slowhigh", 90), timed("fastlow", 40)]

    @hookimpl
    def sdkit_register_backends(registry: Any) -> None:
        for cls in classes:
            registry.add(cls)

    module.sdkit_register_backends = sdkit_register_backends  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    loaded = Plugins([importlib.metadata.EntryPoint("timed", module.__name__, "sdkit")])
    monkeypatch.setattr(plugins_module.manager, "_plugins", loaded)
    yield state
    sys.modules.pop(module.__name__, None)
