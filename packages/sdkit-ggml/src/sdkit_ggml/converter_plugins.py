"""The converters the ggml backend uses: the built-ins plus every plugin's
``sdkit_ggml_register_converters(registry)``, collected once per plugin set.

Plugins are called one at a time through pluggy's public API (``subset_hook_caller``), the
way core collects its own hooks: each registration is attributed to its plugin, and a plugin
whose hook raises (a duplicate key included) is dropped whole and recorded as a
``PluginFailure`` (stage "register") in ``get_plugins().failures``, which ``sdkit doctor``
and ``sdkit backends`` list. ``SDKIT_STRICT_PLUGINS=1`` turns that into ``PluginLoadError``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from sdkit.errors import PluginLoadError
from sdkit.plugins import PluginFailure, Plugins, get_plugins
from sdkit_ggml.compiler.registry import BUILTIN, ConverterRegistry
from sdkit_ggml.converters import register_builtin

HOOK = "sdkit_ggml_register_converters"
STAGE = "register"


def _strict() -> bool:
    # the same switch core reads for its own hooks
    return os.environ.get("SDKIT_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _distribution(plugins: Plugins, name: str) -> str:
    return next((info.distribution for info in plugins.loaded if info.name == name), "?")


def _record(plugins: Plugins, name: str, exc: Exception) -> PluginFailure:
    distribution = _distribution(plugins, name)
    text = f"{HOOK}: {type(exc).__name__}: {exc}"
    if _strict():
        raise PluginLoadError(f"plugin {name!r} ({distribution}) failed to register ggml converters: {text}")
    failure = PluginFailure(name, distribution, text, STAGE)
    if failure not in plugins.failures:  # the registry is rebuilt after reset_default_registry()
        plugins.failures.append(failure)
    return failure


def implementers(plugins: Plugins) -> list[str]:
    """Names of the plugins implementing the converter hook, in registration order."""
    hook = getattr(plugins.pm.hook, HOOK, None)
    if hook is None:  # sdkit-ggml's hookspecs were never added (its plugin did not load)
        return []
    owners = [impl.plugin for impl in hook.get_hookimpls()]
    return [
        name
        for name, plugin in plugins.pm.list_name_plugin()
        if plugin is not None and not plugins.pm.is_blocked(name) and any(plugin is o for o in owners)
    ]


def _caller(plugins: Plugins, name: str) -> Callable[..., Any]:
    """The converter hook of plugin ``name`` alone."""
    others = [p for n, p in plugins.pm.list_name_plugin() if n != name and p is not None]
    caller: Callable[..., Any] = plugins.pm.subset_hook_caller(HOOK, remove_plugins=others)
    return caller


def collect_converters(registry: ConverterRegistry, plugins: Plugins) -> list[PluginFailure]:
    """Call every plugin's converter hook into ``registry``, one plugin at a time."""
    failures = []
    for name in implementers(plugins):
        registry.current_plugin = name
        try:
            _caller(plugins, name)(registry=registry)
        except Exception as exc:  # a broken plugin must never take the others down
            registry.drop_plugin(name)
            failures.append(_record(plugins, name, exc))
    registry.current_plugin = BUILTIN
    return failures


_lock = threading.Lock()
_cache: tuple[Plugins, ConverterRegistry] | None = None


def default_registry() -> ConverterRegistry:
    """Built-in converters plus every plugin's, for the current plugin set (rebuilt after
    ``sdkit.plugins.reset_plugins()``)."""
    global _cache
    plugins = get_plugins()
    with _lock:
        if _cache is None or _cache[0] is not plugins:
            registry = ConverterRegistry()
            register_builtin(registry)
            collect_converters(registry, plugins)
            _cache = (plugins, registry)
        return _cache[1]


def reset_default_registry() -> None:
    """Collect the plugins' converters again on next use (after registering a plugin)."""
    global _cache
    with _lock:
        _cache = None
