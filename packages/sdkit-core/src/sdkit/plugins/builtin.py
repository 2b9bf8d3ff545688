"""Core's own implementations, registered through the same hooks as third parties."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins.registries import BackendRegistry, LoaderRegistry, SchedulerRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit.reference import ReferenceBackend

    registry.add(ReferenceBackend)


@hookimpl
def sdkit_register_model_loaders(registry: LoaderRegistry) -> None:
    from sdkit.loaders import OnnxLoader

    registry.add(OnnxLoader)


@hookimpl
def sdkit_register_schedulers(registry: SchedulerRegistry) -> None:
    from sdkit.schedulers.builtin import BUILTIN_SCHEDULERS

    for scheduler in BUILTIN_SCHEDULERS:
        registry.add(scheduler)
