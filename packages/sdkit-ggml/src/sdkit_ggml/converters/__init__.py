"""Built-in ONNX op converters, one module per op family. Each module registers its
converters at import with ``@converter`` (``table.py``); importing this package imports
them all."""

from __future__ import annotations

from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.converters import (  # noqa: F401 - imported to register their converters
    cast,
    conv,
    conv_concat,
    conv_transpose,
    elementwise,
    fused,
    integer,
    logic,
    matmul,
    norm,
    pad,
    pool,
    reduce,
    resize,
    shape,
    slicing,
)
from sdkit_ggml.converters.table import BUILTIN_CONVERTERS, converter


def register_builtin(registry: ConverterRegistry) -> None:
    """Add every built-in converter to ``registry`` (owned by its ``current_plugin``)."""
    for entry in BUILTIN_CONVERTERS.converters():
        registry.add(entry)


__all__ = ["BUILTIN_CONVERTERS", "converter", "register_builtin"]
