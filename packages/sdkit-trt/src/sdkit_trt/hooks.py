"""Hook implementations of sdkit-trt. Import-light: no tensorrt, tensorrt_rtx or cuda import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins import BackendRegistry


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    from sdkit_trt.backend import TensorRTBackend

    registry.add(TensorRTBackend)
