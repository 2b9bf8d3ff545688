from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _isolated(sdkit_isolated: Path) -> Path:
    """Every core test runs with fresh plugins, probes and a private artifact cache."""
    return sdkit_isolated


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
