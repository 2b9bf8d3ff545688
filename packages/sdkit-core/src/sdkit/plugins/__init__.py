"""sdkit's plugin machinery: hook specs, registries, loading and the typed facade."""

from __future__ import annotations

from sdkit.plugins.hookspecs import hookimpl
from sdkit.plugins.manager import PluginFailure, Plugins, get_plugins, reset_plugins
from sdkit.plugins.registries import BackendRegistry, FamilyRegistry, LoaderRegistry, SchedulerRegistry

__all__ = [
    "BackendRegistry",
    "FamilyRegistry",
    "LoaderRegistry",
    "PluginFailure",
    "Plugins",
    "SchedulerRegistry",
    "get_plugins",
    "hookimpl",
    "reset_plugins",
]
