"""Schedulers are plugins: built-ins come through core's hook, third parties through theirs."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from typing import ClassVar

import numpy as np
import pytest

from sdkit.plugins import Plugins, hookimpl
from sdkit.schedulers import Scheduler, create_scheduler, resolve, scheduler_names
from sdkit.schedulers.k_samplers import Euler


class TwiceEuler(Euler):
    """A third-party sampler: Euler with a different name (behaviour is not the point)."""

    name = "twice_euler"
    aliases: ClassVar[tuple[str, ...]] = ("Twice Euler", "k_twice")


class Impostor(Euler):
    name = "impostor"
    aliases: ClassVar[tuple[str, ...]] = ("Euler a",)  # taken by the built-in euler_a


def _plugin_module(name: str, cls: type[Scheduler], monkeypatch: pytest.MonkeyPatch) -> importlib.metadata.EntryPoint:
    module = types.ModuleType(name)

    @hookimpl
    def sdkit_register_schedulers(registry: object) -> None:
        registry.add(cls)  # type: ignore[attr-defined]

    module.sdkit_register_schedulers = sdkit_register_schedulers  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    return importlib.metadata.EntryPoint(name=name, value=name, group="sdkit")


def test_third_party_scheduler_is_registered_through_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = Plugins(entry_points=[_plugin_module("fake_sampler_plugin", TwiceEuler, monkeypatch)])
    registry = plugins.schedulers
    assert plugins.failures == []
    assert "twice_euler" in scheduler_names(registry)
    assert scheduler_names(registry)[:2] == ["euler", "euler_a"]  # built-ins still there
    assert registry.owner("twice_euler") == "fake_sampler_plugin"
    assert registry.owner("euler") == "core"
    assert resolve("Twice Euler Karras", registry=registry) == ("twice_euler", "karras")
    assert resolve("k_twice", registry=registry) == ("twice_euler", "normal")
    sched = create_scheduler("twice euler", config=None, registry=registry)
    assert isinstance(sched, TwiceEuler)
    sched.set_timesteps(3)
    assert sched.timesteps.shape == (3,)


def test_conflicting_alias_drops_the_plugin_not_the_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = Plugins(entry_points=[_plugin_module("fake_impostor_plugin", Impostor, monkeypatch)])
    assert [f.name for f in plugins.failures] == ["fake_impostor_plugin"]
    assert "Euler a" in plugins.failures[0].error
    assert "impostor" not in plugins.schedulers.names()
    assert resolve("Euler a", registry=plugins.schedulers) == ("euler_a", "normal")


def test_builtin_schedulers_come_from_the_core_plugin() -> None:
    registry = Plugins(entry_points=[]).schedulers
    for name in scheduler_names(registry):
        assert registry.owner(name) == "core"
        cls = registry.get(name)
        assert cls is not None
        assert issubclass(cls, Scheduler)
        # every built-in names its oracle: a diffusers class, else the written-down algorithm it follows
        assert cls.diffusers_class or getattr(cls, "reference", "")
    assert np.array_equal(
        create_scheduler("euler", registry=registry).alphas_cumprod, create_scheduler("euler").alphas_cumprod
    )
