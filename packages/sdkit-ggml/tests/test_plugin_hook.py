"""Third-party converters through the plugin's own hook, sdkit_ggml_register_converters: called
one plugin at a time, attributed, a failing plugin dropped whole and listed as a failure."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.cli.backends import report as backends_report
from sdkit.errors import PluginLoadError
from sdkit.model import Model
from sdkit.plugins import get_plugins, hookimpl
from sdkit.testing import one_node_model
from sdkit_ggml.compiler import ops
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import Node, Value
from sdkit_ggml.compiler.registry import ConverterRegistry
from sdkit_ggml.converter_plugins import default_registry, reset_default_registry


def convert_double(b: Builder, node: Node) -> list[Value]:
    return [ops.scale(b, b.tensor(node, 0), 2.0)]


def convert_negated_relu(b: Builder, node: Node) -> list[Value]:
    return [ops.unary(b, "ggml_neg", ops.unary(b, "ggml_relu", b.tensor(node, 0)))]


Register = Callable[[ConverterRegistry], None]


@pytest.fixture
def add_plugins(sdkit_isolated: Any) -> Iterator[Callable[..., None]]:
    """``add_plugins(name=register_fn, ...)``: plugins implementing the converter hook, on a
    fresh plugin set (sdkit_isolated)."""

    def add(**plugins: Register) -> None:
        pm = get_plugins().pm
        for name, register in plugins.items():
            module = types.ModuleType(name)
            module.sdkit_ggml_register_converters = hookimpl(  # type: ignore[attr-defined]
                lambda registry, register=register: register(registry)
            )
            module.sdkit_ggml_register_converters.__name__ = "sdkit_ggml_register_converters"
            pm.register(module, name=name)
        reset_default_registry()

    yield add
    reset_default_registry()


def _double_model() -> Model:
    node = helper.make_node("Double", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    return Model.from_proto(helper.make_model(graph, opset_imports=opsets))


def _register_double(registry: ConverterRegistry) -> None:
    registry.register("Double", since_version=1, domain="com.example")(convert_double)


def test_hook_adds_a_converter(add_plugins: Callable[..., None]) -> None:
    add_plugins(example=_register_double)
    compiled = sdkit.compile(_double_model(), backend="ggml")
    x = np.array([1.0, -2.0, 3.5], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], 2 * x)
    assert default_registry().lookup("com.example", "Double", 1).owner == "example"  # type: ignore[union-attr]


def test_without_the_plugin_check_reports_the_op(sdkit_isolated: Any) -> None:
    reset_default_registry()
    report = sdkit.check(_double_model(), backend="ggml")["ggml"]
    assert [u.op_type for u in report.unsupported] == ["Double"]


def test_a_failing_plugin_is_dropped_whole_and_listed(add_plugins: Callable[..., None]) -> None:
    def half_then_fail(registry: ConverterRegistry) -> None:
        registry.register("Relu", since_version=14)(convert_negated_relu)  # would override a built-in
        raise RuntimeError("broken plugin")

    add_plugins(broken=half_then_fail, example=_register_double)
    registry = default_registry()
    assert registry.lookup("", "Relu", 17).owner == "ggml"  # type: ignore[union-attr]  # its Relu is undone
    assert registry.lookup("com.example", "Double", 1) is not None  # the other plugin still counts
    data = backends_report()  # what `sdkit backends --json` prints
    [failure] = [f for f in data["plugin_failures"] if f["name"] == "broken"]  # type: ignore[attr-defined]
    assert failure["stage"] == "register"
    assert "sdkit_ggml_register_converters: RuntimeError: broken plugin" in failure["error"]


def test_an_override_is_attributed(add_plugins: Callable[..., None]) -> None:
    add_plugins(negative=lambda r: r.register("Relu", since_version=14)(convert_negated_relu))
    x = np.array([-1.0, 2.0], np.float32)
    model = one_node_model("Relu", {"x": x})
    np.testing.assert_array_equal(sdkit.compile(model, backend="ggml").run({"x": x})["out0"], [0, -2])
    notes = sdkit.check(model, backend="ggml")["ggml"].notes
    assert any("of plugin 'negative' replaces plugin 'ggml'" in n for n in notes), notes


def test_two_plugins_with_one_key_drop_the_second(add_plugins: Callable[..., None]) -> None:
    add_plugins(first=_register_double, second=_register_double)
    assert default_registry().lookup("com.example", "Double", 1).owner == "first"  # type: ignore[union-attr]
    [failure] = [f for f in get_plugins().failures if f.name == "second"]
    assert "both plugin 'first' and plugin 'second'" in failure.error


def test_strict_plugins_turn_a_failure_into_an_error(
    add_plugins: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(registry: ConverterRegistry) -> None:
        raise ValueError("nope")

    add_plugins(broken=fail)
    monkeypatch.setenv("SDKIT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="'broken'"):
        default_registry()
