"""Third-party converters through the plugin's own hook, sdkit_ggml_register_converters."""

from __future__ import annotations

import types
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.model import Model
from sdkit.plugins import get_plugins, hookimpl
from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.converter_plugins import reset_default_registry


@pytest.fixture
def custom_op_plugin() -> Iterator[None]:
    def convert_double(b: Builder, node: Node) -> list[Value]:
        return [ops.scale(b, b.tensor(node, 0), 2.0)]

    @hookimpl
    def sdkit_ggml_register_converters(registry: ConverterRegistry) -> None:
        registry.register("Double", since_version=1, domain="com.example")(convert_double)

    plugin = types.ModuleType("example_ggml_plugin")
    plugin.sdkit_ggml_register_converters = sdkit_ggml_register_converters  # type: ignore[attr-defined]
    pm = get_plugins().pm
    pm.register(plugin, name="example_ggml_plugin")
    reset_default_registry()
    yield
    pm.unregister(name="example_ggml_plugin")
    reset_default_registry()


def _model() -> Model:
    node = helper.make_node("Double", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    return Model.from_proto(helper.make_model(graph, opset_imports=opsets))


def test_hook_adds_a_converter(custom_op_plugin: None) -> None:
    compiled = sdkit.compile(_model(), backend="ggml")
    x = np.array([1.0, -2.0, 3.5], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], 2 * x)


def test_without_the_plugin_check_reports_the_op() -> None:
    reset_default_registry()
    report = sdkit.check(_model(), backend="ggml")["ggml"]
    assert [u.op_type for u in report.unsupported] == ["Double"]
