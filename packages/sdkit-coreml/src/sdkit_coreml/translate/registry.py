"""The converter registry: one function per ONNX op (default domain), with its opset range.

A converter turns one ONNX node into MIL ops inside the program being built. An optional
``check`` looks at the node alone (attributes, opset; no weights, no shapes) and returns why
it cannot be translated, so ``Backend.check`` can name every such node before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from sdkit_coreml.translate.context import Context

ConvertFn = Callable[["Context", onnx.NodeProto], None]
CheckFn = Callable[[onnx.NodeProto, int], "str | None"]


@dataclass(frozen=True)
class Converter:
    op_type: str
    fn: ConvertFn
    since: int  # the oldest opset whose semantics the converter implements
    check: CheckFn | None = None


CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str, since: int = 1, check: CheckFn | None = None) -> Callable[[ConvertFn], ConvertFn]:
    """Register ``fn`` for each of ``op_types`` (ONNX default domain)."""

    def register(fn: ConvertFn) -> ConvertFn:
        for op_type in op_types:
            if op_type in CONVERTERS:
                raise RuntimeError(f"two Core ML converters for {op_type}")
            CONVERTERS[op_type] = Converter(op_type, fn, since, check)
        return fn

    return register


def load_converters() -> dict[str, Converter]:
    """Import every converter module once (they register on import)."""
    from sdkit_coreml.translate import einsum, elementwise, layout, nn, norm  # noqa: F401

    return CONVERTERS


def why_unsupported(node: onnx.NodeProto, opset: int) -> str | None:
    """None when ``node`` can be translated at ``opset``, else the reason."""
    if node.domain not in ("", "ai.onnx"):
        return f"custom domain {node.domain!r}: sdkit-coreml translates standard ONNX operators only"
    found = load_converters().get(node.op_type)
    if found is None:
        return "sdkit-coreml has no Core ML translation for this operator"
    if opset < found.since:
        return f"translated from opset {found.since} on; this model uses opset {opset}"
    return found.check(node, opset) if found.check is not None else None
