"""sdkit plugin hooks of sdkit-ggml. Imports no ggml library: the backend loads it lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    import pluggy

    from sdkit.plugins.registries import BackendRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit_ggml.backend import GgmlBackend

    registry.add(GgmlBackend)


@hookimpl
def sdkit_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    from sdkit_ggml import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
