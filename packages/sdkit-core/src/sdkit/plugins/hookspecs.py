"""sdkit's hook specifications (pluggy project ``sdkit``, entry-point group ``sdkit``).

Registration hooks collect; core decides. A plugin's hook module must stay import-light:
no vendor SDK (tensorrt, openvino, coremltools, migraphx, libggml) at import time. Every
``registry.add`` takes a class or a ``"package.module:Class"`` reference to one, imported when it
is added (a reference that fails to import drops the plugin, recorded like any failing hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from sdkit.plugins.registries import BackendRegistry, FamilyRegistry, LoaderRegistry, SchedulerRegistry

PROJECT = "sdkit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def sdkit_register_backends(registry: BackendRegistry) -> None:
    """Add Backend classes with ``registry.add(BackendClass)``.

    Called once per process, after every plugin is loaded. Register classes, not instances:
    core instantiates them lazily. Names must be unique across plugins.
    """


@hookspec
def sdkit_register_model_loaders(registry: LoaderRegistry) -> None:
    """Add model loaders with ``registry.add(LoaderClass)``.

    A loader has a ``name``, a ``priority`` (higher first), a ``kind`` (``"model"``, the
    default, or ``"pipeline"``), a cheap ``sniff(path) -> bool`` and ``load(path, **kwargs)``.
    ``sdkit.load_model`` asks every loader in priority order and uses the first that sniffs true;
    ``sdkit.load_pipeline`` asks the ``"pipeline"`` loaders only, passing its own keywords
    (``backend``, ``device``, ``memory``, compile options): subclass
    ``sdkit.pipelines.PipelineLoader``, which also gives ``explain(path)`` for refusals.
    """


@hookspec
def sdkit_register_schedulers(registry: SchedulerRegistry) -> None:
    """Add diffusion schedulers (samplers) with ``registry.add(SchedulerClass)``.

    A scheduler class has a ``name`` and ``aliases`` (the names A1111 and ComfyUI users know).
    """


@hookspec
def sdkit_register_model_families(registry: FamilyRegistry) -> None:
    """Add model families with ``registry.add(family)``: ``sdkit.families.Family`` objects (or
    ``"module:attr"`` references to them), each an architecture whose weightless graphs it
    names, with the key maps from the checkpoint layouts it reads, its probe tensors and its
    defaults (prediction type, latent scale, native size, scheduler config, tokenizers).

    Called once per process, after every plugin is loaded. Names must be unique across plugins.
    ``sdkit.load_pipeline`` on a ``.safetensors`` checkpoint asks every family, the highest
    ``priority`` first, whether the file's keys and shapes are its own (``Family.detect``).
    Build SD-like ones with ``sdkit.families.sd_family``; tests register tiny ones this way.
    """


@hookspec(historic=True)
def sdkit_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Let a plugin publish hooks of its own (``pluginmanager.add_hookspecs(module)``).

    Historic: a plugin registered later still receives the call. sdkit-ggml uses it for
    ``sdkit_ggml_register_converters(registry)``.
    """
