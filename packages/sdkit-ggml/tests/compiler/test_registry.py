"""compiler/registry.py: lookup by (domain, op, since_version), the ai.onnx domain rule, owners,
overrides, duplicates and undoing a failed plugin; converters/table.py: the built-in table."""

from __future__ import annotations

import pytest
from onnx import helper

from sdkit.errors import DuplicateNameError
from sdkit_ggml.compiler.context import Value
from sdkit_ggml.compiler.registry import (
    BUILTIN,
    Converter,
    ConverterRegistry,
    no_converter_reason,
    onnx_domain,
    opsets_of,
)
from sdkit_ggml.converters import BUILTIN_CONVERTERS


def _fn(*_: object) -> list[Value]:
    return []


def _other(*_: object) -> list[Value]:
    return []


def test_newest_version_at_or_below_the_opset() -> None:
    registry = ConverterRegistry()
    registry.add(Converter("", "Op", 7, _fn))
    registry.add(Converter("", "Op", 13, _other))
    assert registry.lookup("", "Op", 6) is None
    assert registry.lookup("", "Op", 12).convert is _fn  # type: ignore[union-attr]
    assert registry.lookup("", "Op", 13).convert is _other  # type: ignore[union-attr]
    assert registry.lookup("", "Op", 99).convert is _other  # type: ignore[union-attr]
    assert registry.known("", "Op") == [7, 13]


def test_ai_onnx_is_the_default_domain() -> None:
    assert onnx_domain("ai.onnx") == onnx_domain("") == ""
    assert onnx_domain("com.microsoft") == "com.microsoft"
    registry = ConverterRegistry()
    registry.add(Converter("ai.onnx", "Op", 1, _fn))
    assert registry.lookup("", "Op", 1) is not None
    assert registry.lookup("ai.onnx", "Op", 1) is not None
    model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("ai.onnx", 17)])
    assert opsets_of(model) == {"": 17}


def test_one_message_for_a_missing_converter() -> None:
    registry = ConverterRegistry()
    registry.add(Converter("", "Op", 13, _fn))
    assert no_converter_reason(registry, "", "Op", 11) == "no converter for opset 11 (have: [13])"
    assert no_converter_reason(registry, "", "Other", 11) == "operator not supported by sdkit-ggml"


def test_a_plugin_overrides_a_builtin_and_is_attributed() -> None:
    registry = ConverterRegistry()
    registry.add(Converter("", "Relu", 14, _fn))
    registry.current_plugin = "fast_relu"
    registry.add(Converter("", "Relu", 14, _other))
    assert registry.lookup("", "Relu", 17).owner == "fast_relu"  # type: ignore[union-attr]
    [override] = registry.overrides()
    assert (override.op_type, override.replaced, override.by) == ("Relu", BUILTIN, "fast_relu")
    registry.drop_plugin("fast_relu")  # a failed plugin: the built-in is used again
    assert registry.lookup("", "Relu", 17).convert is _fn  # type: ignore[union-attr]
    assert registry.overrides() == []


def test_two_plugins_claiming_one_key_is_an_error_naming_both() -> None:
    registry = ConverterRegistry()
    registry.current_plugin = "a"
    registry.add(Converter("com.example", "Op", 1, _fn))
    registry.current_plugin = "b"
    with pytest.raises(DuplicateNameError, match="'a' and plugin 'b'"):
        registry.add(Converter("com.example", "Op", 1, _other))


def test_decorator_registers_every_op_named() -> None:
    registry = ConverterRegistry()
    registry.register(["A", "B"], since_version=3, domain="com.example")(_fn)
    assert registry.ops() == [("com.example", "A"), ("com.example", "B")]
    with pytest.raises(ValueError, match="since_version"):
        registry.add(Converter("", "Op", 0, _fn))


def test_builtin_table_serves_every_converter_module() -> None:
    ops = {op for _, op in BUILTIN_CONVERTERS.ops()}
    for op in ("Add", "Cast", "Conv", "ConvTranspose", "MatMul", "LayerNormalization", "Pad", "MaxPool", "Resize"):
        assert op in ops
    assert {c.owner for c in BUILTIN_CONVERTERS.converters()} == {BUILTIN}
    # each static check takes the node alone and accepts a plain node of its op
    for converter in BUILTIN_CONVERTERS.converters():
        if converter.check is not None and converter.op_type in ("Conv", "MaxPool", "Resize", "ArgMax"):
            node = helper.make_node(converter.op_type, ["x"], ["y"])
            assert converter.check(node) is None, converter.op_type
