"""The memory budget (``sdkit.limits``): requests that would exceed it are refused with a
ResourceLimitError before anything is allocated, for every backend alike."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit import limits
from sdkit.errors import InputError, OptionError, ResourceLimitError
from sdkit.model import Model


def _relu(dims: list[int | str]) -> Model:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _expand(shape: list[int]) -> Model:
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])],
        "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(shape, np.int64), "shape")],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8G", 8 << 30), ("512MiB", 512 << 20), ("1.5k", 1536), ("4096", 4096), (" 2 gb ", 2 << 30), (7, 7)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert limits.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "1.2.3G", "8X"])
def test_parse_size_refuses_nonsense(text: str) -> None:
    with pytest.raises(OptionError):
        limits.parse_size(text)


def test_budget_sources(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert limits.memory_budget() == limits.machine_memory()
    assert 0 < limits.machine_memory() < 1 << 62
    assert limits.parse_size("50%") == limits.machine_memory() // 2
    config = tmp_path / "config.toml"
    config.write_text('memory_budget = "3G"\n')
    monkeypatch.setenv("SDKIT_CONFIG", str(config))
    assert limits.memory_budget() == 3 << 30
    monkeypatch.setenv(limits.ENV, "2G")  # the environment wins over the config file
    assert limits.memory_budget() == 2 << 30
    limits.set_memory_budget("1M")  # and the process setting over both
    try:
        assert limits.memory_budget() == 1 << 20
    finally:
        limits.set_memory_budget(None)
    assert limits.memory_budget() == 2 << 30


def test_sizes_are_exact_integers() -> None:
    # 2^62 float32 elements: 2^64 bytes, which wraps to 0 in 64-bit size_t arithmetic
    assert limits.shape_bytes([1, 4, 2**30, 2**30], 4) == 2**64
    with pytest.raises(InputError, match="negative dimension"):
        limits.shape_bytes([2, -3], 4)


@pytest.mark.parametrize("shape", [(2**31, 2**31), (200000, 200000), (1, 4 * 2**40)])
def test_huge_input_shapes_refused_before_compile(shape: tuple[int, ...]) -> None:
    with pytest.raises(ResourceLimitError, match="over the memory budget"):
        sdkit.compile(_relu(["a", "b"]), backend="reference", input_shapes={"x": shape})


def test_negative_input_shapes_refused() -> None:
    with pytest.raises(InputError, match="negative dimension"):
        sdkit.compile(_relu(["a", "b"]), backend="reference", input_shapes={"x": (-3, 4)})


def test_huge_declared_dims_refused() -> None:
    with pytest.raises(ResourceLimitError, match="'x'"):
        sdkit.compile(_relu([1, 4, 200000, 200000]), backend="reference")


@pytest.mark.parametrize("shape", [[1, 4, 2**30, 2**30], [1, 4, 2**17, 2**16], [2**31, 2**31, 2, 2]])
def test_huge_intermediate_refused_before_compile(shape: list[int]) -> None:
    """Expand to a shape held in an initializer: inferred and refused before any backend."""
    with pytest.raises(ResourceLimitError, match="tensor 'y'"):
        sdkit.compile(_expand(shape), backend="reference")


def test_budget_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _relu([64, 64])  # 16 kB
    sdkit.compile(model, backend="reference")
    monkeypatch.setenv(limits.ENV, "8k")
    with pytest.raises(ResourceLimitError, match=r"8\.19 kB"):
        sdkit.compile(model, backend="reference")


def test_graph_check_is_cheap_on_a_big_graph(sd_graphs) -> None:  # type: ignore[no-untyped-def]
    """Shape inference only: the SD 1.5 UNet graph (7,378 nodes) passes without weights."""
    limits.check_graph_memory(sd_graphs.load_graph("sd15_unet"))


def test_empty_inputs_are_one_clear_error_on_every_backend() -> None:
    """Issue 15: a latent of shape 1x32x0x8 ran on ggml with numpy RuntimeWarnings and exit 0.
    One behaviour everywhere: an empty input is refused unless the model declares that dim 0."""
    model = _relu([1, 32, "h", 8])
    with pytest.raises(InputError, match="empty along axis 2"):
        sdkit.compile(model, backend="reference").run({"x": np.zeros((1, 32, 0, 8), np.float32)})
    with pytest.raises(InputError, match="empty along axis 2"):
        sdkit.compile(model, backend="reference", input_shapes={"x": [1, 32, 0, 8]})
    declared_empty = _relu([1, 0])
    out = sdkit.compile(declared_empty, backend="reference").run({"x": np.zeros((1, 0), np.float32)})
    assert out["y"].shape == (1, 0)


@pytest.mark.parametrize("backend", ["ggml", "openvino"])
def test_empty_inputs_on_compiler_backends(backend: str) -> None:
    pytest.importorskip(f"sdkit_{backend}")
    pytest.importorskip({"ggml": "sdkit_ggml", "openvino": "openvino"}[backend])
    compiled = sdkit.compile(_relu([1, 32, "h", 8]), backend=backend)
    with pytest.raises(InputError, match="empty along axis 2"):
        compiled.run({"x": np.zeros((1, 32, 0, 8), np.float32)})
