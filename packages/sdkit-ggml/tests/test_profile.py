"""Per-node profiling through ggml's scheduler eval callback, and the CPU build's features."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import sdkit
from sdkit.model import Model
from sdkit_ggml.runtime.buildinfo import backend_features, missing_isa
from sdkit_ggml.runtime.lib import load_library
from sdkit_ggml.runtime.profile import profile_program


def conv_matmul_model() -> Model:
    """Conv 8->16 (3x3, pad 1) on 12x12, Relu, then MatMul over the last axis with a [12, 5]."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 3, 3], rng.standard_normal(16 * 8 * 9).tolist())
    m = helper.make_tensor("m", TensorProto.FLOAT, [12, 5], rng.standard_normal(60).tolist())
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("MatMul", ["r", "m"], ["y"]),
        ],
        "conv_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 5])],
        [w, m],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return Model.from_proto(proto)


def test_profile_times_each_node_and_leaves_the_program_runnable() -> None:
    model = conv_matmul_model()
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    compiled = sdkit.compile(model, backend="ggml", threads=1)
    before = compiled.run({"x": x})["y"]
    program = compiled.program_for({"x": x})  # type: ignore[attr-defined]

    profile = profile_program(program, {"x": x}, threads=1, repeat=2)

    kinds = {k.op for k in profile.by_kind()}
    assert {"IM2COL", "MUL_MAT", "RELU"} <= kinds, kinds
    assert not kinds & {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"}  # folded, not timed
    assert all(n.seconds >= 0 for n in profile.nodes)
    assert abs(profile.total_s - sum(k.seconds for k in profile.kinds.values())) < 1e-12
    # Work of the two products, counted from the ONNX shapes: conv 16 x (8*3*3) x 144 pixels,
    # matmul (16*12) rows x 12 x 5.
    expected = 2 * (16 * 72 * 144) + 2 * (16 * 12 * 12 * 5)
    assert profile.kinds["MUL_MAT"].flop == expected
    # The profile ran the same graph on the same inputs: a plain run afterwards is unchanged,
    # and agrees with the reference evaluator.
    after = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(after, before)
    reference = sdkit.compile(model, backend="reference").run({"x": x})["y"]
    np.testing.assert_allclose(after, reference, rtol=1e-4, atol=1e-4)
    assert "MUL_MAT" in profile.table()


def test_backend_features_name_the_compiled_isa() -> None:
    lib = load_library()
    features = backend_features(lib)
    if lib.ggml_backend_dev_count() and features:  # every ggml CPU build publishes its ISA
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in features.items())
    assert backend_features(lib, "no such device") == {}


def test_missing_isa_compares_build_with_cpu() -> None:
    built = {"AVX": "1", "AVX2": "1", "FMA": "1", "F16C": "1"}
    assert missing_isa(built, {"avx", "avx2", "fma", "f16c"}) == []
    assert missing_isa(built, {"avx", "avx2", "avx512f", "bmi2"}) == ["BMI2", "AVX512"]
