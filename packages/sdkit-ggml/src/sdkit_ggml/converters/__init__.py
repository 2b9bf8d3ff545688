"""Built-in ONNX op converters, one module per op family."""

from __future__ import annotations

from sdkit_ggml.compiler.registry import ConverterRegistry


def register_builtin(registry: ConverterRegistry) -> None:
    from sdkit_ggml.converters import conv, elementwise, logic, matmul, norm, pool, reduce, resize, shape

    for module in (elementwise, shape, conv, norm, resize, matmul, reduce, logic, pool):
        module.register(registry)
    shape.register_shape_producers(registry)
