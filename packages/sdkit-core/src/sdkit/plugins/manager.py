"""Plugin loading, validation and the typed facade core uses instead of ``pm.hook.*``.

Each entry point of group ``sdkit`` is imported and registered on its own, inside
try/except: one broken plugin is recorded (name, distribution, error) and the others load.
``SDKIT_STRICT_PLUGINS=1`` turns a failure into ``PluginLoadError``;
``SDKIT_DISABLE_PLUGINS=a,b`` skips plugins by entry name.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from sdkit.backend import Availability, Backend
from sdkit.errors import DuplicateNameError, PluginLoadError
from sdkit.plugins import builtin, hookspecs
from sdkit.plugins.registries import BackendRegistry, FamilyRegistry, LoaderRegistry, Registry, SchedulerRegistry

ENTRY_POINT_GROUP = "sdkit"
CORE_PLUGIN = "core"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose registration failed."""

    name: str
    distribution: str
    error: str
    stage: str  # "import", "validate" or "register"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str
    version: str


def _strict() -> bool:
    return os.environ.get("SDKIT_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _disabled() -> set[str]:
    return {p.strip() for p in os.environ.get("SDKIT_DISABLE_PLUGINS", "").split(",") if p.strip()}


def _dist_of(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or "?", dist.version or "?"


class Plugins:
    """All plugins of this process and what they registered. Use ``get_plugins()``.

    It also holds what this process learnt about them: one instance of each backend and its
    probe result (``sdkit.selection`` fills them), so ``reset_plugins()`` forgets both at once.
    """

    def __init__(self, entry_points: list[importlib.metadata.EntryPoint] | None = None) -> None:
        self.backend_instances: dict[str, Backend] = {}
        self.probes: dict[str, Availability] = {}
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self.disabled: list[str] = []
        self.loaded: list[PluginInfo] = []
        # Historic: every plugin registered from now on gets this call as it registers.
        self.pm.hook.sdkit_addhooks.call_historic(kwargs={"pluginmanager": self.pm})
        self.pm.register(builtin, name=CORE_PLUGIN)
        self._load_entry_points(entry_points)
        self._validate()
        self.pm.check_pending()
        self.backends = BackendRegistry()
        self.loaders = LoaderRegistry()
        self.schedulers = SchedulerRegistry()
        self.families = FamilyRegistry()
        self._collect("sdkit_register_backends", self.backends)
        self._collect("sdkit_register_model_loaders", self.loaders)
        self._collect("sdkit_register_schedulers", self.schedulers)
        self._collect("sdkit_register_model_families", self.families)

    def _fail(self, name: str, distribution: str, error: BaseException | str, stage: str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if _strict():
            raise PluginLoadError(f"plugin {name!r} ({distribution}) failed to {stage}: {text}")
        self.failures.append(PluginFailure(name, distribution, text, stage))

    def _load_entry_points(self, entry_points: list[importlib.metadata.EntryPoint] | None) -> None:
        eps = (
            entry_points if entry_points is not None else list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        )
        disabled = _disabled()
        seen: set[str] = set()
        for ep in sorted(eps, key=lambda e: e.name):
            distribution, version = _dist_of(ep)
            if ep.name in disabled:
                self.disabled.append(ep.name)
                continue
            if ep.name in seen or ep.name == CORE_PLUGIN:
                self._fail(ep.name, distribution, f"entry-point name {ep.name!r} is already taken", "import")
                continue
            seen.add(ep.name)
            try:
                plugin = ep.load()
                self.pm.register(plugin, name=ep.name)
            except Exception as exc:  # a broken plugin must never take the others down
                self._fail(ep.name, distribution, exc, "import")
                continue
            self.loaded.append(PluginInfo(ep.name, distribution, version))

    def _validate(self) -> None:
        """Unregister plugins implementing unknown ``sdkit_*`` hooks (after every
        ``sdkit_addhooks`` ran), so ``check_pending()`` cannot fail for the rest."""
        for name, plugin in list(self.pm.list_name_plugin()):
            if plugin is None:
                continue
            unknown = [
                attr
                for attr in dir(plugin)
                if attr.startswith("sdkit_")
                and callable(getattr(plugin, attr, None))
                and not isinstance(getattr(plugin, attr), type)
                and self.pm.parse_hookimpl_opts(plugin, attr) is not None
                and not (hasattr(self.pm.hook, attr) and getattr(self.pm.hook, attr).has_spec())
            ]
            if unknown:
                self.pm.unregister(name=name)
                self._drop_loaded(name)
                self._fail(
                    name, self._distribution(name), f"implements unknown hook(s): {', '.join(unknown)}", "validate"
                )

    def _drop_loaded(self, name: str) -> None:
        self.loaded = [p for p in self.loaded if p.name != name]

    def _distribution(self, name: str) -> str:
        for info in self.loaded:
            if info.name == name:
                return info.distribution
        return "sdkit-core" if name == CORE_PLUGIN else "?"

    def _collect(self, hook_name: str, registry: Registry[Any]) -> None:
        """Call ``hook_name`` one plugin at a time, so each registration is attributed to its
        plugin, and a plugin whose hook raises is dropped whole."""
        for name, plugin in list(self.pm.list_name_plugin()):
            if plugin is None or self.pm.is_blocked(name):
                continue
            if not any(impl.plugin is plugin for impl in getattr(self.pm.hook, hook_name).get_hookimpls()):
                continue
            others = [p for n, p in self.pm.list_name_plugin() if n != name and p is not None]
            caller: Callable[..., Any] = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
            registry.current_plugin = name
            try:
                caller(registry=registry)
            except DuplicateNameError as exc:
                registry.drop_plugin(name)
                self._fail(name, self._distribution(name), str(exc), "register")
            except Exception as exc:
                registry.drop_plugin(name)
                self._fail(name, self._distribution(name), exc, "register")
        registry.current_plugin = "<unknown>"


_lock = threading.RLock()
_plugins: Plugins | None = None
_loading = False


def get_plugins() -> Plugins:
    """The process-wide plugin set, loaded on first use."""
    global _plugins, _loading
    with _lock:
        if _plugins is None:
            if _loading:  # a plugin's hook called back into sdkit: fail it, never deadlock
                raise PluginLoadError("a plugin called into sdkit while the plugins were still loading")
            _loading = True
            try:
                _plugins = Plugins()
            finally:
                _loading = False
        return _plugins


def reset_plugins() -> None:
    """Forget loaded plugins, their backend instances and probe results (tests, or after
    changing SDKIT_* plugin variables)."""
    global _plugins
    with _lock:
        _plugins = None
