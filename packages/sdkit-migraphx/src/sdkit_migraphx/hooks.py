"""Hook implementations of sdkit-migraphx. Import-light: no ``migraphx`` import here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins import BackendRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit_migraphx.backend import MigraphxBackend

    registry.add(MigraphxBackend)
