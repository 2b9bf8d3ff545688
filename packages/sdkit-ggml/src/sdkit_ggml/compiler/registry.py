"""The converter registry: ONNX (domain, op, since_version) -> a function building ggml ops.

A converter registered ``since_version=13`` serves every model whose opset is 13 or newer
until a converter with a higher ``since_version`` (at or below the model's opset) exists.
Third-party plugins add converters through the ``sdkit_ggml_register_converters`` hook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdkit_ggml.compiler.context import Builder, Node, Value

ConvertFn = Callable[["Builder", "Node"], "list[Value]"]
# Static validation of a node (attributes, dtypes) without building: returns a reason or None.
CheckFn = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Converter:
    domain: str
    op_type: str
    since_version: int
    convert: ConvertFn
    check: CheckFn | None = None


class ConverterRegistry:
    """Converters by (domain, op_type), each a list sorted by ``since_version``."""

    def __init__(self) -> None:
        self._by_op: dict[tuple[str, str], list[Converter]] = {}

    def add(self, converter: Converter) -> None:
        key = (_domain(converter.domain), converter.op_type)
        entries = [c for c in self._by_op.get(key, []) if c.since_version != converter.since_version]
        entries.append(converter)
        entries.sort(key=lambda c: c.since_version)
        self._by_op[key] = entries

    def register(
        self, op_types: str | Iterable[str], since_version: int = 1, domain: str = "", check: CheckFn | None = None
    ) -> Callable[[ConvertFn], ConvertFn]:
        """Decorator: ``@registry.register("Relu", since_version=14)``."""
        names = [op_types] if isinstance(op_types, str) else list(op_types)

        def decorate(fn: ConvertFn) -> ConvertFn:
            for name in names:
                self.add(Converter(domain, name, since_version, fn, check))
            return fn

        return decorate

    def lookup(self, domain: str, op_type: str, opset: int) -> Converter | None:
        """The newest converter with ``since_version <= opset``; None when there is none."""
        entries = self._by_op.get((_domain(domain), op_type), [])
        best = None
        for converter in entries:
            if converter.since_version <= opset:
                best = converter
        return best

    def known(self, domain: str, op_type: str) -> list[int]:
        """The since_versions registered for an op (to explain an opset mismatch)."""
        return [c.since_version for c in self._by_op.get((_domain(domain), op_type), [])]

    def ops(self) -> list[tuple[str, str]]:
        return sorted(self._by_op)


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


_default: ConverterRegistry | None = None


def default_registry() -> ConverterRegistry:
    """Built-in converters plus every plugin's ``sdkit_ggml_register_converters``."""
    global _default
    if _default is None:
        registry = ConverterRegistry()
        from sdkit_ggml.converters import register_builtin

        register_builtin(registry)
        from sdkit_ggml.hookspecs import call_register_converters

        call_register_converters(registry)
        _default = registry
    return _default


def reset_default_registry() -> None:
    global _default
    _default = None
