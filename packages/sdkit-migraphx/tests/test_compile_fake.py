"""Compile/run plumbing against the recording fake ``migraphx``: options, cache keys, the fp16
choice, shapes, error mapping. No MIGraphX runs here; the fake computes nothing (its ``run``
returns what each test hands it), so these tests check what sdkit asks of MIGraphX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from migraphx_fake import FakeMigraphx
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.cache import key_digest
from sdkit.errors import DeviceError, InputError, ModelFormatError, OptionError, SdkitError, UnsupportedOperatorError
from sdkit.model import Model
from sdkit_migraphx.settings import Settings, program_key


def conv_model(dims: list[Any], extra_nodes: list[Any] | None = None) -> Model:
    """x -> Conv(w) -> y, plus an int64 side input ``ids`` -> Identity -> ``ids_out``."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
        *(extra_nodes or []),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("ids_out", TensorProto.INT64, None),
        ],
        initializer=[numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def feeds(batch: int = 1, size: int = 8) -> dict[str, np.ndarray]:
    return {"x": np.zeros((batch, 3, size, size), np.float32), "ids": np.zeros((batch, 3), np.int64)}


def echo_shapes(params: dict[str, Any]) -> list[np.ndarray]:
    """The fake's answer: arrays of the right shapes (zeros, float64 / int32 on purpose, to
    check that sdkit casts to the declared output dtypes)."""
    x = np.asarray(params["x"])
    return [np.zeros((x.shape[0], 2, x.shape[2], x.shape[3])), np.asarray(params["ids"]).astype(np.int32)]


def test_parse_quantize_compile_save_in_order(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    fake_migraphx.respond = echo_shapes
    compiled = sdkit.compile(conv_model(["batch", 3, "h", "w"]), backend="migraphx", precision="fp16")
    probing = fake_migraphx.names()
    assert set(probing) == {"get_target"}  # the probe; symbolic dims: nothing compiled yet
    out = compiled.run(feeds(2, 8))
    assert fake_migraphx.names()[len(probing) :] == [
        "parse_onnx",
        "quantize_fp16",
        "get_target",
        "compile",
        "save",
        "run",
    ]
    calls = dict(fake_migraphx.calls)
    assert calls["parse_onnx"]["map_input_dims"] == {"x": [2, 3, 8, 8], "ids": [2, 3]}
    assert calls["quantize_fp16"] == {"compiled": False}  # quantized before compiling
    assert calls["compile"] == {"target": "gpu", "offload_copy": True, "fast_math": True, "exhaustive_tune": False}
    assert calls["save"]["format"] == "msgpack" and calls["save"]["filename"].endswith("model.mxr")
    assert calls["run"]["params"] == {"x": ("float32", [2, 3, 8, 8]), "ids": ("int64", [2, 3])}
    assert out["y"].dtype == np.float32 and out["y"].shape == (2, 2, 8, 8)
    assert out["ids_out"].dtype == np.int64
    assert compiled.info["compiles"][0]["shapes"] == {"x": [2, 3, 8, 8], "ids": [2, 3]}


def test_fp32_is_not_quantized_and_not_fast_math(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", input_shapes={"ids": (1, 3)})
    assert "quantize_fp16" not in fake_migraphx.names()  # static shapes: compiled at once
    assert dict(fake_migraphx.calls)["compile"]["fast_math"] is False
    sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", input_shapes={"ids": (1, 3)}, fast_math=True,
                  exhaustive_tune=True, cache=False)  # fmt: skip
    assert fake_migraphx.calls[-1] == (
        "compile",
        {"target": "gpu", "offload_copy": True, "fast_math": True, "exhaustive_tune": True},
    )


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"precision": "bf16"}, "fp32 or fp16"),
        ({"fast_math": "yes"}, "wrong type"),
        ({"offload_copy": False}, "unknown option 'offload_copy'"),
    ],
)
def test_bad_options(fake_migraphx: FakeMigraphx, sdkit_isolated: Path, options: dict[str, Any], words: str) -> None:
    with pytest.raises(OptionError, match=words):
        sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", **options)


def test_cache_hit_then_weights_change(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    model = conv_model([1, 3, 8, 8])
    shapes = {"ids": (1, 3)}
    first = sdkit.compile(model, backend="migraphx", input_shapes=shapes)
    second = sdkit.compile(model, backend="migraphx", input_shapes=shapes)
    assert fake_migraphx.names().count("parse_onnx") == 1 and fake_migraphx.names()[-1] == "load"
    assert [c["from_cache"] for c in (*first.info["compiles"], *second.info["compiles"])] == [False, True]
    mxr = list((sdkit_isolated / "artifacts" / "migraphx").glob("*/model.mxr"))
    assert len(mxr) == 1
    second.refit(model.weights.updated({"w": np.full((2, 3, 3, 3), 2, np.float32)}))
    assert fake_migraphx.names().count("parse_onnx") == 2  # new weights: recompiled
    assert len(list((sdkit_isolated / "artifacts" / "migraphx").glob("*/model.mxr"))) == 2
    assert second.info["refit_seconds"] >= 0


def test_key_fields() -> None:
    base = {
        "graph_hash": "g",
        "weights_hash": "w",
        "version": "2.16.0",
        "gfx": "gfx1100",
        "settings": Settings("fp32", False, False),
        "input_shapes": {"x": [1, 3, 8, 8]},
    }
    digest = key_digest(program_key(**base))  # type: ignore[arg-type]
    changes = [
        {"weights_hash": "w2"},
        {"version": "2.15.0"},
        {"gfx": "gfx90a"},
        {"settings": Settings("fp16", True, False)},
        {"settings": Settings("fp32", True, False)},
        {"input_shapes": {"x": [2, 3, 8, 8]}},
        {"graph_hash": "g2"},
    ]
    digests = {key_digest(program_key(**{**base, **change})) for change in changes}  # type: ignore[arg-type]
    assert len(digests) == len(changes) and digest not in digests


def test_unknown_operator_names_every_node(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    extra = [
        helper.make_node("MyOp", ["y"], ["m1"], name="first_custom", domain="my.domain"),
        helper.make_node("MyOp", ["y"], ["m2"], name="second_custom", domain="my.domain"),
    ]
    model = conv_model([1, 3, 8, 8], extra)
    with pytest.raises(UnsupportedOperatorError) as error:
        sdkit.compile(model, backend="migraphx", input_shapes={"ids": (1, 3)})
    assert [p.node for p in error.value.problems] == ["first_custom", "second_custom"]


def test_other_failures_map_to_sdkit_errors(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    fake_migraphx.parse_error = "/src/onnx/onnx_parser.cpp:611: parse_graph: PARSE_GRAPH: invalid onnx file"
    with pytest.raises(ModelFormatError, match="MIGraphX cannot parse this ONNX model: PARSE_GRAPH: invalid"):
        sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", input_shapes={"ids": (1, 3)})
    fake_migraphx.parse_error = ""
    fake_migraphx.compile_error = "/src/targets/gpu/compile_ops.cpp:99: compile: hipErrorNoBinaryForGpu"
    with pytest.raises(SdkitError, match="MIGraphX failed to compile the model for rocm:0: hipErrorNoBinaryForGpu"):
        sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", input_shapes={"ids": (1, 3)})
    fake_migraphx.compile_error = ""
    fake_migraphx.run_error = "out of memory"
    compiled = sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", input_shapes={"ids": (1, 3)})
    with pytest.raises(InputError, match="MIGraphX failed to run the model on these inputs: out of memory"):
        compiled.run(feeds())


def test_one_program_per_signature(fake_migraphx: FakeMigraphx, sdkit_isolated: Path) -> None:
    fake_migraphx.respond = echo_shapes
    compiled = sdkit.compile(conv_model(["batch", 3, "h", "w"]), backend="migraphx")
    compiled.run(feeds(1, 8))
    compiled.run(feeds(1, 16))
    compiled.run(feeds(1, 8))
    assert fake_migraphx.names().count("parse_onnx") == 2
    assert [c["shapes"]["x"] for c in compiled.info["compiles"]] == [[1, 3, 8, 8], [1, 3, 16, 16]]
    with pytest.raises(InputError, match="dimension 'batch'"):
        compiled.run({"x": np.zeros((2, 3, 8, 8), np.float32), "ids": np.zeros((1, 3), np.int64)})


def test_second_gpu_is_refused_not_silently_swapped(
    fake_migraphx: FakeMigraphx, sdkit_isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdkit.device import Device
    from sdkit_migraphx import backend

    monkeypatch.setattr(backend, "amd_gpus", lambda: [Device("rocm", 0, "gfx1100"), Device("rocm", 1, "gfx1100")])
    with pytest.raises(DeviceError, match="HIP_VISIBLE_DEVICES=1"):
        sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", device="rocm:1")
    with pytest.raises(DeviceError, match="no device rocm:7"):
        sdkit.compile(conv_model([1, 3, 8, 8]), backend="migraphx", device="rocm:7")
