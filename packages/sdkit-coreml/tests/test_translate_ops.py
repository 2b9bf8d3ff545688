"""Translation semantics, op by op, against onnxruntime: graphs of constants are translated
and coremltools' own value inference (its numpy implementation of each MIL op) computes the
result, so no Core ML runtime is needed. Covers the shape arithmetic the SD exports lean on
(Slice with INT64 sentinels, Reshape 0, negative Gather, broadcasting Where/Expand), the
normalizations (GroupNorm as exported and as the ONNX op, LayerNorm), attention, and the ops
of the SD3 / Flux / Chroma transformers (Einsum in every form the translator takes, Mod with
both sign conventions, Tile). Conv and Resize have no value inference in coremltools: only
the macOS tests check their numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from coreml_helpers import fold_with_mil, graph_model, needs_coremltools, run_ort
from onnx import TensorProto, helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
X6 = RNG.standard_normal((2, 6, 4, 5)).astype(np.float32)
INT64_MAX = np.iinfo(np.int64).max


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


CASES: dict[str, tuple[list[Any], dict[str, np.ndarray], int]] = {
    "slice_to_end_negative_step": (
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
        {"x": X, "s": i64(1, -1), "e": i64(INT64_MAX, -INT64_MAX), "a": i64(1, 3), "st": i64(1, -2)},
        F,
    ),
    "reshape_zero_copies": (
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        {"x": X, "shape": i64(0, 0, -1)},
        F,
    ),
    "gather_negative_index": (
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=2)],
        {"x": X, "i": i64(-1, 0)},
        F,
    ),
    "shape_gather_concat": (
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
            helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
            helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        {"x": X, "zero": np.array(0, np.int64), "axes": i64(0), "minus1": i64(-1)},
        F,
    ),
    "where_broadcasts_the_condition": (
        [helper.make_node("Where", ["c", "a", "b"], ["y"])],
        {"c": RNG.random((1, 1, 3, 3)) > 0.5, "a": np.float32(-1e4), "b": np.float32(0)},
        F,
    ),
    "expand_both_ways": (
        [helper.make_node("Expand", ["v", "shape"], ["y"])],
        {"v": RNG.standard_normal((3, 1)).astype(np.float32), "shape": i64(2, 1, 4)},
        F,
    ),
    "constant_of_shape_and_range": (
        [
            helper.make_node("ConstantOfShape", ["n"], ["z"], value=helper.make_tensor("v", I64, [1], [3])),
            helper.make_node("Range", ["zero", "five", "one"], ["r"]),
            helper.make_node("Add", ["z", "r"], ["y"]),
        ],
        {"n": i64(5), "zero": np.array(0, np.int64), "five": np.array(5, np.int64), "one": np.array(1, np.int64)},
        I64,
    ),
    "pad_constant": (
        [helper.make_node("Pad", ["x", "pads", "value"], ["y"])],
        {"x": X, "pads": i64(0, 0, 1, 2, 0, 0, 3, 0), "value": np.array(0.5, np.float32)},
        F,
    ),
    "transpose_flatten_squeeze": (
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
            helper.make_node("Flatten", ["t"], ["f"], axis=2),
            helper.make_node("Unsqueeze", ["f", "axes"], ["u"]),
            helper.make_node("Squeeze", ["u", "axes"], ["y"]),
        ],
        {"x": X, "axes": i64(1)},
        F,
    ),
    "integer_div_and_cast": (
        [
            helper.make_node("Div", ["a", "b"], ["d"]),
            helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT),
        ],
        {"a": i64(320, 7, 64), "b": i64(8, 2, 64)},
        F,
    ),
    "gemm_linear": (
        [helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1)],
        {"a": X[0, 0], "w": RNG.standard_normal((6, 5)).astype(np.float32), "c": np.ones(6, np.float32)},
        F,
    ),
    "attention_scores": (
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["m"]),
            helper.make_node("Softmax", ["m"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        {
            "q": RNG.standard_normal((2, 6, 8)).astype(np.float32),
            "k": RNG.standard_normal((2, 5, 8)).astype(np.float32),
            "v": RNG.standard_normal((2, 5, 8)).astype(np.float32),
            "scale": np.float32(8**-0.5),
        },
        F,
    ),
    "group_norm": (
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-5)],
        {"x": X6, "s": RNG.standard_normal(6).astype(np.float32), "b": RNG.standard_normal(6).astype(np.float32)},
        F,
    ),
    "exported_group_norm": (  # how torch exports GroupNorm(3, 6): reshape -> instance norm -> reshape -> affine
        [
            helper.make_node("Reshape", ["x", "grouped"], ["g"]),
            helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"], epsilon=1e-5),
            helper.make_node("Reshape", ["n", "back"], ["r"]),
            helper.make_node("Mul", ["r", "gamma"], ["m"]),
            helper.make_node("Add", ["m", "beta"], ["y"]),
        ],
        {
            "x": X6,
            "grouped": i64(0, 3, -1),
            "ones": np.ones(3, np.float32),
            "zeros": np.zeros(3, np.float32),
            "back": i64(2, 6, 4, 5),
            "gamma": RNG.standard_normal((6, 1, 1)).astype(np.float32),
            "beta": RNG.standard_normal((6, 1, 1)).astype(np.float32),
        },
        F,
    ),
    "layer_norm": (
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
        {"x": X, "s": RNG.standard_normal(5).astype(np.float32), "b": RNG.standard_normal(5).astype(np.float32)},
        F,
    ),
    "erf_sigmoid_tanh": (
        [
            helper.make_node("Erf", ["x"], ["e"]),
            helper.make_node("Sigmoid", ["e"], ["s"]),
            helper.make_node("Tanh", ["s"], ["y"]),
        ],
        {"x": X},
        F,
    ),
}


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# Einsum: the exports' forms (SD3's unpatchify permutation, Flux's RoPE outer product) and the
# matmul-like ones: batch / left / inner / right index groups of 0, 1 and several indices.
EINSUMS: dict[str, list[np.ndarray]] = {
    "nhwpqc->nchpwq": [f32(1, 2, 3, 2, 2, 4)],
    "i,j->ij": [f32(5), f32(3)],
    "ij->ji": [f32(3, 4)],
    "ijk->ki": [f32(2, 3, 4)],
    "ij,ij->ij": [f32(3, 4), f32(3, 4)],
    "bij,bjk->bik": [f32(2, 3, 4), f32(2, 4, 5)],
    "bhqd,bhkd->bhqk": [f32(2, 3, 4, 8), f32(2, 3, 5, 8)],
    "abcd,cde->abe": [f32(2, 3, 4, 5), f32(4, 5, 6)],
    "ij,j->i": [f32(3, 4), f32(4)],
    "j,jk->k": [f32(4), f32(4, 5)],
    "ab,bc->a": [f32(3, 4), f32(4, 5)],
    "bi,bj->bij": [f32(2, 3), f32(2, 4)],
    "ij,jk": [f32(3, 4), f32(4, 5)],
}
for equation, operands in EINSUMS.items():
    names = [f"e{i}" for i in range(len(operands))]
    CASES[f"einsum_{equation}"] = (
        [helper.make_node("Einsum", names, ["y"], equation=equation)],
        dict(zip(names, operands, strict=True)),
        F,
    )
# Mod: every sign combination, both conventions; integer and float (floats take fmod=1 only)
DIVIDENDS, DIVISORS = i64(7, -7, 7, -7, 0, 6, -6, 5), i64(3, 3, -3, -3, 3, -3, 3, 7)
for fmod in (0, 1):
    CASES[f"mod_int_fmod{fmod}"] = (
        [helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
        {"a": DIVIDENDS, "b": DIVISORS},
        I64,
    )
CASES["mod_float_fmod1"] = (
    [helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)],
    {"a": np.array([7.5, -7.5, 7.5, -7.5, 0.0, 6.0], np.float32), "b": np.array([2, 2, -2, -2, 3, -1.5], np.float32)},
    F,
)
CASES["mod_broadcast_after_add"] = (  # Flux's attention: (-1 + 3) % 3 on shapes
    [helper.make_node("Add", ["n", "minus1"], ["s"]), helper.make_node("Mod", ["s", "n"], ["y"])],
    {"n": i64(3), "minus1": np.array(-1, np.int64)},
    I64,
)
CASES["gather_bool"] = (  # T5's mask: a bool gather (MIL gathers numbers only)
    [helper.make_node("Gather", ["m", "i"], ["g"], axis=1), helper.make_node("Cast", ["g"], ["y"], to=F)],
    {"m": RNG.random((2, 5, 3)) > 0.5, "i": i64(4, 0, -1)},
    F,
)
ZERO_BIAS = [  # the exported SDPA's attention bias: zeros of [heads, L, S] times a scale, added to the scores
    helper.make_node("ConstantOfShape", ["bias_shape"], ["zeros"], value=helper.make_tensor("v", F, [1], [0.0])),
    helper.make_node("Cast", ["one"], ["scale"], to=F),
    helper.make_node("Mul", ["zeros", "scale"], ["bias"]),
    helper.make_node("Add", ["scores", "bias"], ["y"]),
]
CASES["zero_bias_add"] = (
    ZERO_BIAS,
    {"bias_shape": i64(2, 3, 4), "one": np.array(1, np.int64), "scores": f32(2, 3, 4)},
    F,
)
CASES["fill_arithmetic"] = (  # fills combined stay fills: (5 * 2 - 3) everywhere, then a real add
    [
        helper.make_node("ConstantOfShape", ["n"], ["five"], value=helper.make_tensor("v", F, [1], [5.0])),
        helper.make_node("Mul", ["five", "two"], ["ten"]),
        helper.make_node("Sub", ["ten", "three"], ["seven"]),
        helper.make_node("Add", ["x", "seven"], ["y"]),
    ],
    {"n": i64(3, 4), "two": np.float32(2), "three": np.full((1, 4), 3, np.float32), "x": f32(3, 4)},
    F,
)
CASES["leaky_relu"] = ([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": X}, F)
CASES["prelu_per_channel"] = (  # ESRGAN Compact: one slope per channel, [C, 1, 1]
    [helper.make_node("PRelu", ["x", "slope"], ["y"])],
    {"x": X, "slope": np.array([0.1, 0.25, 0.5], np.float32).reshape(3, 1, 1)},
    F,
)
CASES["batch_norm_inference"] = (  # RetinaFace / ParseNet: BatchNorm2d in eval mode
    [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-5)],
    {
        "x": X,
        "scale": np.array([0.5, 1.0, 1.5], np.float32),
        "bias": np.array([0.1, -0.2, 0.0], np.float32),
        "mean": np.array([0.3, -0.1, 0.05], np.float32),
        "var": np.array([0.5, 1.2, 0.01], np.float32),
    },
    F,
)
CASES["tile"] = ([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": f32(2, 1, 3), "r": i64(2, 4, 1)}, F)
CASES["tile_int_after_unsqueeze"] = (  # Flux's RoPE: cos/sin repeated along a new last axis
    [helper.make_node("Unsqueeze", ["v", "axes"], ["u"]), helper.make_node("Tile", ["u", "r"], ["y"])],
    {"v": i64(1, 2, 3), "axes": i64(-1), "r": i64(1, 2)},
    I64,
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_translation_matches_onnxruntime(case: str) -> None:
    needs_coremltools()
    nodes, values, out_type = CASES[case]
    opset = 21 if case == "group_norm" else 17
    model = graph_model(nodes, [], [("y", out_type, None)], {k: np.asarray(v) for k, v in values.items()}, opset)
    (want,) = run_ort(model.graph.to_onnx(model.weights), {})
    got = fold_with_mil(model)["y"]
    assert got is not None, "MIL could not compute the result"
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_float_mod_with_fmod0_follows_numpy() -> None:
    """onnxruntime refuses floats with fmod=0; onnx's reference implementation (numpy's mod:
    the sign of the divisor) is the oracle."""
    needs_coremltools()
    from onnx.reference import ReferenceEvaluator

    values = {"a": np.array([7.5, -7.5, 7.5, -7.5, 0.0], np.float32), "b": np.array([2, 2, -2, -2, 3], np.float32)}
    model = graph_model([helper.make_node("Mod", ["a", "b"], ["y"])], [], [("y", F, None)], values)
    (want,) = ReferenceEvaluator(model.graph.to_onnx(model.weights)).run(None, {})
    np.testing.assert_array_equal(want, [1.5, 0.5, -0.5, -1.5, 0.0])  # the oracle is the convention asked for
    np.testing.assert_allclose(fold_with_mil(model)["y"], want, atol=1e-6)


def test_einsum_and_tile_translate_with_symbolic_dims() -> None:
    """Dynamic dims keep the shape arithmetic in the program: it type-checks, and the dims
    that pass through keep their symbols."""
    needs_coremltools()
    from sdkit_coreml.program import build_program
    from sdkit_coreml.runtime import target_named

    nodes = [
        helper.make_node("Einsum", ["a", "b"], ["c"], equation="nkl,klm->nm"),
        helper.make_node("Einsum", ["c"], ["t"], equation="nm->mn"),
        helper.make_node("Einsum", ["i", "j"], ["o"], equation="i,j->ij"),
        helper.make_node("Tile", ["o", "r"], ["y"]),
    ]
    inputs = [("a", F, ["n", 2, 3]), ("b", F, [2, 3, 4]), ("i", F, ["tokens"]), ("j", F, [8])]
    model = graph_model(nodes, inputs, [("t", F, None), ("y", F, None)], {"r": i64(1, 2)})
    program, names = build_program(model.graph, dict(model.weights), target_named("macOS13"))
    function = program.functions["main"]
    t, y = (function.outputs[i] for i in range(2))
    n, tokens = function.inputs[names.inputs["a"]].shape[0], function.inputs[names.inputs["i"]].shape[0]
    assert t.shape == (4, n)
    assert y.shape == (tokens, 16)
    assert "matmul" in {op.op_type for op in function.operations}


def test_a_zero_attention_bias_is_no_constant_at_all() -> None:
    """Static shapes fold the bias's shape; the zeros must not become a [heads, L, S] constant
    (1 GB per attention at 1024 px) nor an add: the scores pass through."""
    needs_coremltools()
    from sdkit_coreml.program import build_program
    from sdkit_coreml.runtime import target_named

    model = graph_model(
        ZERO_BIAS, [("scores", F, [8, 4096, 4096])], [("y", F, None)], {"bias_shape": i64(8, 4096, 4096),
        "one": np.array(1, np.int64)},
    )  # fmt: skip
    program, _ = build_program(model.graph, dict(model.weights), target_named("macOS13"))
    function = program.functions["main"]
    assert [op.op_type for op in function.operations] == ["identity"]
    assert function.outputs[0].shape == (8, 4096, 4096)


def _attention(mask: bool, second_use: bool = False) -> tuple[list[Any], dict[str, np.ndarray]]:
    """The chain diffusers' exports contain: MatMul(q, kT) * scale (+ mask) -> Softmax -> Cast ->
    MatMul(v); ``second_use`` also returns the probabilities (which forbids fusing)."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["m"]),
        helper.make_node("Add", ["m", "mask"], ["a"]) if mask else helper.make_node("Identity", ["m"], ["a"]),
        helper.make_node("Softmax", ["a"], ["p"], axis=-1),
        helper.make_node("Cast", ["p"], ["pc"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["pc", "v"], ["y"]),
    ]
    if second_use:
        nodes.append(helper.make_node("Identity", ["p"], ["probs"]))
    values = {
        "q": RNG.standard_normal((2, 6, 8)).astype(np.float32),
        "k": RNG.standard_normal((2, 5, 8)).astype(np.float32),
        "v": RNG.standard_normal((2, 5, 4)).astype(np.float32),
        "scale": np.float32(0.3),  # not 1/sqrt(8): the graph's own scale must survive
        "mask": np.where(RNG.random((1, 6, 5)) > 0.3, 0, -1e4).astype(np.float32),
    }
    return nodes, values


@pytest.mark.parametrize("mask", [False, True])
def test_attention_becomes_sdpa_on_macos15(mask: bool) -> None:
    needs_coremltools()
    nodes, values = _attention(mask)
    model = graph_model(nodes, [], [("y", F, None)], values)
    (want,) = run_ort(model.graph.to_onnx(model.weights), {})
    ops: list[str] = []
    got = fold_with_mil(model, "macOS15", ops)["y"]
    assert "scaled_dot_product_attention" in ops
    assert got is not None
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plain: list[str] = []
    fold_with_mil(model, "macOS14", plain)
    assert "scaled_dot_product_attention" not in plain


def test_attention_with_a_second_use_stays_op_by_op() -> None:
    needs_coremltools()
    nodes, values = _attention(True, second_use=True)
    model = graph_model(nodes, [], [("y", F, None), ("probs", F, None)], values)
    ops: list[str] = []
    fold_with_mil(model, "macOS15", ops)
    assert "scaled_dot_product_attention" not in ops
