"""sdkit plugin hooks. Import-light: OpenVINO itself is imported only by ``probe``/``compile``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins.registries import BackendRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit_openvino.backend import OpenVinoBackend

    registry.add(OpenVinoBackend)
