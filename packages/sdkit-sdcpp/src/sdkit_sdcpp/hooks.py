"""sdkit plugin hooks of sdkit-sdcpp. Imports no stable-diffusion.cpp: the loader loads it lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins.registries import LoaderRegistry


@hookimpl
def sdkit_register_model_loaders(registry: LoaderRegistry) -> None:
    registry.add("sdkit_sdcpp.loader:SdcppLoader")
