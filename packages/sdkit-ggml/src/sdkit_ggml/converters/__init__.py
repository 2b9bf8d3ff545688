"""Built-in ONNX op converters, one module per op family."""

from __future__ import annotations

from sdkit_ggml.compiler.registry import ConverterRegistry


def register_builtin(registry: ConverterRegistry) -> None:
    from sdkit_ggml.converters import conv, elementwise, norm, resize, shape

    for module in (elementwise, shape, conv, norm, resize):
        module.register(registry)
