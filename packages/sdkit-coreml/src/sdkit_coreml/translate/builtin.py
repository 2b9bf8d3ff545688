"""The built-in converters, all registered: importing this module imports every converter
module once (each registers its ops with ``@converter`` on import, ``registry``).

It is the only module that imports the converter modules, so the registry never imports back
into them (the registry <-> converters circle this package once had).
"""

from __future__ import annotations

import onnx

from sdkit_coreml.translate import einsum, elementwise, layout, nn, norm  # noqa: F401 - they register on import
from sdkit_coreml.translate.registry import CONVERTERS, Converter


def load_converters() -> dict[str, Converter]:
    """Every built-in converter, by ONNX op type (the converter modules are imported above)."""
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
