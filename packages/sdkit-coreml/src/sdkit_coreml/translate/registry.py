"""The converter registry: one function per ONNX op (default domain), with its opset range.

A converter turns one ONNX node into MIL ops inside the program being built. An optional
``check`` looks at the node alone (attributes, opset; no weights, no shapes) and returns why
it cannot be translated, so ``Backend.check`` can name every such node before any work.

This module imports no converter: each converter module imports it and registers itself, and
``builtin`` imports the converter modules (as sdkit-ggml's ``converters`` package does).
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
