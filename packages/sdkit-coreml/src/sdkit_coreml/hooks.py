"""Hook implementations of sdkit-coreml. Import-light: no ``coremltools`` import here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins import BackendRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit_coreml.backend import CoremlBackend

    registry.add(CoremlBackend)
