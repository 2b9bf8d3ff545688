"""The converter registry: ONNX (domain, op, since_version) -> a function building ggml ops.

A converter registered ``since_version=13`` serves every model whose opset is 13 or newer
until a converter with a higher ``since_version`` (at or below the model's opset) exists.
Each registration records the plugin that made it: a plugin may override a built-in
converter (recorded in ``overrides``), two plugins claiming the same key is an error naming
both, and ``drop_plugin`` undoes everything a failed plugin registered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from sdkit.errors import DuplicateNameError

if TYPE_CHECKING:
    from sdkit_ggml.compiler.builder import Builder
    from sdkit_ggml.compiler.context import Node, Value

ConvertFn = Callable[["Builder", "Node"], "list[Value]"]
# Static validation of a node (attributes) without building: returns a reason or None.
CheckFn = Callable[[onnx.NodeProto], "str | None"]
BUILTIN = "ggml"  # the owner of sdkit-ggml's own converters (its plugin entry name)


def onnx_domain(domain: str) -> str:
    """The one spelling of the default ONNX domain: ``""`` (models may write ``ai.onnx``)."""
    return "" if domain in ("", "ai.onnx") else domain


def opsets_of(proto: onnx.ModelProto) -> dict[str, int]:
    """Opset version per (normalised) domain."""
    return {onnx_domain(e.domain): int(e.version) for e in proto.opset_import}


def opset_for(node: onnx.NodeProto, opsets: Mapping[str, int]) -> int:
    return opsets.get(onnx_domain(node.domain), 1)


@dataclass(frozen=True)
class Converter:
    domain: str
    op_type: str
    since_version: int
    convert: ConvertFn
    check: CheckFn | None = None
    owner: str = BUILTIN


@dataclass(frozen=True)
class Override:
    """A converter in use that takes an op over from another plugin's."""

    domain: str
    op_type: str
    since_version: int
    replaced: str  # the plugin whose converter is no longer used
    by: str


class ConverterRegistry:
    """Converters by (domain, op_type), each a list sorted by ``since_version``."""

    def __init__(self) -> None:
        # every registration in order; the last one for a key wins (a plugin over a built-in)
        self._entries: list[Converter] = []
        self._index: dict[tuple[str, str], dict[int, Converter]] | None = None
        self.current_plugin = BUILTIN

    def add(self, converter: Converter) -> Converter:
        """Register ``converter`` for the plugin now registering (``current_plugin``)."""
        if not converter.op_type or not isinstance(converter.since_version, int) or converter.since_version < 1:
            raise ValueError(f"converter {converter.op_type!r} needs an op type and a since_version >= 1")
        entry = Converter(
            onnx_domain(converter.domain),
            converter.op_type,
            converter.since_version,
            converter.convert,
            converter.check,
            self.current_plugin,
        )
        for other in self._same_key(entry):
            if other.owner == entry.owner or BUILTIN not in (other.owner, entry.owner):
                raise DuplicateNameError(
                    f"ggml converter {_label(entry)} is registered by both "
                    f"plugin {other.owner!r} and plugin {entry.owner!r}"
                )
        self._entries.append(entry)
        self._index = None
        return entry

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

    def _same_key(self, converter: Converter) -> list[Converter]:
        key = (converter.domain, converter.op_type, converter.since_version)
        return [c for c in self._entries if (c.domain, c.op_type, c.since_version) == key]

    def _versions(self, domain: str, op_type: str) -> dict[int, Converter]:
        """since_version -> the converter in use (the latest registration of each)."""
        if self._index is None:
            index: dict[tuple[str, str], dict[int, Converter]] = {}
            for converter in self._entries:
                index.setdefault((converter.domain, converter.op_type), {})[converter.since_version] = converter
            self._index = index
        return self._index.get((onnx_domain(domain), op_type), {})

    def lookup(self, domain: str, op_type: str, opset: int) -> Converter | None:
        """The newest converter with ``since_version <= opset``; None when there is none."""
        usable = [v for v in self._versions(domain, op_type) if v <= opset]
        return self._versions(domain, op_type)[max(usable)] if usable else None

    def known(self, domain: str, op_type: str) -> list[int]:
        """The since_versions registered for an op (to explain an opset mismatch)."""
        return sorted(self._versions(domain, op_type))

    def ops(self) -> list[tuple[str, str]]:
        return sorted({(c.domain, c.op_type) for c in self._entries})

    def converters(self) -> list[Converter]:
        """Every converter in use, one per key."""
        return [c for d, op in self.ops() for c in self._versions(d, op).values()]

    def overrides(self) -> list[Override]:
        """Converters in use that take an op over from the plugin that registered it first
        (the same key replaced, or a newer since_version ahead of it), with both plugins."""
        found = []
        for domain, op_type in self.ops():
            first = next(c.owner for c in self._entries if (c.domain, c.op_type) == (domain, op_type))
            for converter in self._versions(domain, op_type).values():
                if converter.owner != first:
                    found.append(Override(*_key(converter), replaced=first, by=converter.owner))
        return found

    def owners(self) -> set[str]:
        return {c.owner for c in self._entries}

    def drop_plugin(self, plugin: str) -> None:
        """Forget everything a (failed) plugin registered; what it overrode is used again."""
        self._entries = [c for c in self._entries if c.owner != plugin]
        self._index = None

    def copy(self) -> ConverterRegistry:
        other = ConverterRegistry()
        other._entries = list(self._entries)
        return other


def no_converter_reason(registry: ConverterRegistry, domain: str, op_type: str, opset: int) -> str:
    """The one message for a node no converter serves."""
    versions = registry.known(domain, op_type)
    if versions:
        return f"no converter for opset {opset} (have: {versions})"
    return "operator not supported by sdkit-ggml"


def _key(converter: Converter) -> tuple[str, str, int]:
    return converter.domain, converter.op_type, converter.since_version


def _label(converter: Converter) -> str:
    domain = f"{converter.domain}." if converter.domain else ""
    return f"{domain}{converter.op_type} (since opset {converter.since_version})"


__all__ = ["Converter", "ConverterRegistry", "Override", "no_converter_reason", "onnx_domain", "opsets_of"]
