"""The table of built-in converters, filled at import by ``@converter`` in each family module
(onnx2torch style): keyed by (domain, op, since_version); a model's node is served by the
newest version at or below the model's opset. ``register_builtin`` copies it into a registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sdkit_ggml.compiler.registry import CheckFn, ConverterRegistry, ConvertFn

BUILTIN_CONVERTERS = ConverterRegistry()


def converter(
    op_types: str | Iterable[str], since_version: int, *, domain: str = "", check: CheckFn | None = None
) -> Callable[[ConvertFn], ConvertFn]:
    """Register the decorated function as the built-in converter of ``op_types`` from opset
    ``since_version``; ``check`` refuses nodes by their attributes alone (before any shape is
    known), for compile and check() alike."""
    return BUILTIN_CONVERTERS.register(op_types, since_version=since_version, domain=domain, check=check)
