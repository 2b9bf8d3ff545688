"""compiler/conv_strategy.py and conv_tuning.py: Conv through ggml_conv_2d_direct
against onnxruntime, the strategy forced by option and environment, auto's timing stored in
the artifact cache and reused, and the shapes direct cannot take left to im2col."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import OptionError
from sdkit.model import Model
from sdkit_ggml import conv_tuning
from sdkit_ggml.compiler import conv_strategy
from sdkit_ggml.compiler.conv_strategy import ConvChooser, ConvShape
from sdkit_ggml.runtime.lib import GGML_TYPE_F32, load_library

ATOL = 1e-5  # as tests/converters/test_conv.py: F32 sums in another order than the oracle

pytestmark = pytest.mark.skipif(
    not load_library().has("ggml_conv_2d_direct"), reason="this ggml has no ggml_conv_2d_direct"
)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto's timings go to this test's own artifact cache; no strategy from the caller's env."""
    monkeypatch.setenv("SDKIT_CACHE_DIR", str(tmp_path / "sdkit-cache"))
    monkeypatch.delenv(conv_strategy.ENV, raising=False)


def conv_model(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any], bias: bool = True) -> Model:
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")]
    names = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        names.append("b")
    node = helper.make_node("Conv", names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def onnxruntime_out(model: Model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 4, 7, 6), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 4, 9, 7), (5, 4, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 1]}),  # asymmetric: padded first
        ((2, 3, 8, 10), (4, 3, 3, 2), {"dilations": [2, 1], "pads": [2, 1, 2, 1], "strides": [1, 2]}),
        ((1, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
        ((1, 3, 11), (4, 3, 3), {"pads": [1, 1]}),  # 1-D, as a 2-D conv of height 1
        ((1, 5, 6, 9), (7, 5, 1, 1), {}),
    ],
)
def test_direct_matches_onnxruntime(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    model = conv_model(x_shape, w_shape, attrs)
    x = np.random.default_rng(3).standard_normal(x_shape).astype(np.float32)
    compiled = sdkit.compile(model, backend="ggml", threads=1, conv="direct")
    got = compiled.run({"x": x})["y"]
    np.testing.assert_allclose(got, onnxruntime_out(model, x), atol=ATOL, rtol=0)
    assert set(compiled.info["conv_strategies"].values()) == {"direct"}


def test_strategy_from_the_environment_and_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    model = conv_model((1, 4, 6, 6), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]})
    monkeypatch.setenv(conv_strategy.ENV, "direct")
    by_env = sdkit.compile(model, backend="ggml", threads=1)
    assert by_env.info["conv"] == "direct"
    assert list(by_env.info["conv_strategies"].values()) == ["direct"]
    by_option = sdkit.compile(model, backend="ggml", threads=1, conv="im2col")  # the option wins
    assert list(by_option.info["conv_strategies"].values()) == ["im2col"]
    monkeypatch.delenv(conv_strategy.ENV)
    assert sdkit.compile(model, backend="ggml", threads=1).info["conv"] == conv_strategy.DEFAULT_MODE


def test_an_unknown_strategy_is_an_option_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model = conv_model((1, 4, 6, 6), (6, 4, 3, 3), {})
    with pytest.raises(OptionError, match="conv strategy must be one of"):
        sdkit.compile(model, backend="ggml", conv="winograd")
    monkeypatch.setenv(conv_strategy.ENV, "fastest")
    with pytest.raises(OptionError, match="SDKIT_GGML_CONV"):
        sdkit.compile(model, backend="ggml")


def test_auto_times_once_then_reuses_the_cached_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # a small shape made worth timing: the floor lowered, the timing still real
    monkeypatch.setattr(conv_tuning, "MIN_MACS", 0)
    monkeypatch.setattr(conv_tuning, "RUNS", 1)
    model = conv_model((1, 8, 12, 10), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]})
    x = np.random.default_rng(5).standard_normal((1, 8, 12, 10)).astype(np.float32)
    before = len(conv_tuning.MEASURED)
    first = sdkit.compile(model, backend="ggml", threads=1, conv="auto")
    assert len(conv_tuning.MEASURED) == before + 1
    (name,) = first.info["conv_timings"]
    assert set(first.info["conv_timings"][name]) == {"im2col", "direct"}  # direct is exact here
    np.testing.assert_allclose(first.run({"x": x})["y"], onnxruntime_out(model, x), atol=ATOL, rtol=0)
    second = sdkit.compile(model, backend="ggml", threads=1, conv="auto")
    assert len(conv_tuning.MEASURED) == before + 1  # read from the artifact cache, not timed
    assert second.info["conv_timings"] == first.info["conv_timings"]
    assert second.info["conv_strategies"] == first.info["conv_strategies"]
    sdkit.compile(model, backend="ggml", threads=1, conv="auto", cache=False)
    assert len(conv_tuning.MEASURED) == before + 2  # cache=False: timed again


def test_auto_does_not_time_tiny_shapes() -> None:
    model = conv_model((1, 4, 6, 6), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]})
    before = len(conv_tuning.MEASURED)
    compiled = sdkit.compile(model, backend="ggml", threads=1, conv="auto")
    assert len(conv_tuning.MEASURED) == before
    assert list(compiled.info["conv_strategies"].values()) == ["im2col"]
    assert compiled.info["conv_timings"] == {}


def test_auto_takes_direct_only_when_clearly_faster() -> None:
    shape = ConvShape((1, 64, 64, 64), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), GGML_TYPE_F32)
    for direct, expected in ((0.5, "direct"), (0.97, "im2col"), (1.5, "im2col")):
        chooser = ConvChooser("auto", True, timer=lambda _, d=direct: {"im2col": 1.0, "direct": d})
        assert chooser(shape) == expected
        assert chooser.timings[shape.describe()] == {"im2col": 1.0, "direct": direct}
    assert ConvChooser("auto", True, timer=lambda _: {"im2col": 1.0})(shape) == "im2col"  # direct not exact


def test_a_shape_direct_cannot_take_falls_back_to_im2col() -> None:
    # GGML_OP_CONV_2D's 16 MB work buffer must hold 8 patch rows of C*KH*KW floats
    huge = ConvShape((1, 600_000, 1, 1), (1, 600_000, 1, 1), (1, 1), (0, 0), (1, 1), GGML_TYPE_F32)
    assert not huge.direct_fits()
    chooser = ConvChooser("direct", direct_available=True)
    assert chooser(huge) == "im2col"
    small = ConvShape((1, 4, 6, 6), (6, 4, 3, 3), (1, 1), (1, 1), (1, 1), GGML_TYPE_F32)
    assert chooser(small) == "direct"
    assert ConvChooser("direct", direct_available=False)(small) == "im2col"  # a ggml without it
    model = conv_model((1, 600_000, 1, 1), (2, 600_000, 1, 1), {}, bias=False)
    x = np.random.default_rng(1).standard_normal((1, 600_000, 1, 1)).astype(np.float32)
    compiled = sdkit.compile(model, backend="ggml", threads=1, conv="direct")
    assert list(compiled.info["conv_strategies"].values()) == ["im2col"]
    # two dot products of 600k unit-variance terms (partial sums ~800): float32 orders differ by ~1e-2
    np.testing.assert_allclose(compiled.run({"x": x})["y"], onnxruntime_out(model, x), rtol=0, atol=2e-2)
