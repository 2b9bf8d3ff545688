"""One-node ONNX models for the converter tests, run through the ggml backend and compared
with onnx.reference (the oracle); refusals must be an UnsupportedModelError, never an abort."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import sdkit
from sdkit.errors import SdkitError, UnsupportedModelError
from sdkit.model import Model
from sdkit_ggml.backend import GgmlBackend
from sdkit_ggml.compiler.check import check_graph
from sdkit_ggml.converter_plugins import default_registry

# An input of a one-node model: ("x", array) is a graph input, ("w", array, "const") an
# initializer, None an omitted optional input.
Operand = tuple[str, np.ndarray] | tuple[str, np.ndarray, str] | None


def node_model(
    op: str,
    operands: Sequence[Operand],
    attributes: Mapping[str, Any] | None = None,
    *,
    outputs: int = 1,
    opset: int = 17,
    strict: bool = True,
) -> Model:
    """A one-node model whose inputs keep the given order (graph inputs and initializers mixed).
    Output types come from ONNX shape inference (``strict=False`` for a node it rejects, to
    test that ggml refuses it cleanly too), else from the first operand's dtype."""
    names, graph_inputs, initializers = [], [], []
    for operand in operands:
        if operand is None:
            names.append("")
            continue
        name, array = operand[0], np.asarray(operand[1])
        names.append(name)
        if len(operand) == 3:
            initializers.append(numpy_helper.from_array(array, name))
        else:
            dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, dtype, array.shape))
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, names, out_names, **dict(attributes or {}))
    undefined = [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names]
    graph = helper.make_graph([node], f"{op.lower()}_test", graph_inputs, undefined, initializer=initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=strict)
    types = {vi.name: vi.type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    first = next(np.asarray(o[1]).dtype for o in operands if o is not None)
    for output in proto.graph.output:
        known = types.get(output.name)
        if known is not None and known.tensor_type.elem_type:
            output.type.CopyFrom(known)
        else:
            output.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(first)
    return Model.from_proto(proto)


def _reference(model: Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(v) for v in ReferenceEvaluator(model.graph.to_onnx(model.weights)).run(None, dict(feeds))]


def _max_diff(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want|, equal infinities counting as 0; shapes and dtypes must match."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if not got.size:
        return 0.0
    a, b = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.where(a == b, 0.0, np.abs(a - b))))


def _onnxruntime(model: Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    return [np.asarray(v) for v in session.run(None, dict(feeds))]


def feeds_of(operands: Sequence[Operand]) -> dict[str, np.ndarray]:
    return {o[0]: np.asarray(o[1]) for o in operands if o is not None and len(o) == 2}


def matches_reference(
    op: str,
    operands: Sequence[Operand],
    attributes: Mapping[str, Any] | None = None,
    *,
    atol: float,
    outputs: int = 1,
    opset: int = 17,
    oracle: str = "onnx.reference",
) -> dict[str, np.ndarray]:
    """Compile and run the node on ggml; assert every output is within ``atol`` of the oracle
    (onnx.reference, or onnxruntime where onnx.reference is wrong or lacks the case) and that
    check() found nothing to refuse."""
    model = node_model(op, operands, attributes, outputs=outputs, opset=opset)
    report = GgmlBackend().check(model.graph)
    assert report.ok, report.unsupported
    feeds = feeds_of(operands)
    got = sdkit.compile(model, backend="ggml").run(feeds)
    expected = _onnxruntime(model, feeds) if oracle == "onnxruntime" else _reference(model, feeds)
    diffs = {o.name: _max_diff(got[o.name], want) for o, want in zip(model.outputs, expected, strict=True)}
    worst = {k: v for k, v in diffs.items() if not v <= atol}
    assert not worst, f"{op}: outputs differ from onnx.reference by more than {atol}: {worst}"
    return got


def refused(
    op: str,
    operands: Sequence[Operand],
    attributes: Mapping[str, Any] | None = None,
    *,
    match: str,
    by_check: bool | None = None,
    outputs: int = 1,
    opset: int = 17,
    strict: bool = True,
) -> UnsupportedModelError:
    """Assert ggml refuses the node with an UnsupportedModelError whose message contains
    ``match`` (compile or first run, never an abort), and that check() refuses it too
    (``by_check=True``), or leaves it to compile because it needs a value check() does not
    have, a weight's or an input's (``by_check=False``); either when None."""
    model = node_model(op, operands, attributes, outputs=outputs, opset=opset, strict=strict)
    result = check_graph(model.graph.proto, default_registry())
    by_check_refused = any(match in u.reason for u in result.unsupported)
    deferred = "out0" in result.deferred
    expected = {True: by_check_refused, False: deferred, None: by_check_refused or deferred}[by_check]
    assert expected, (result.unsupported, result.deferred)
    with pytest.raises(UnsupportedModelError, match=match) as caught:
        sdkit.compile(model, backend="ggml").run(feeds_of(operands))
    assert isinstance(caught.value, SdkitError)
    return caught.value


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def f32(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """``f32(2, 3)``: a float32 array of standard normal values."""
    return lambda *shape: rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def like_reference() -> Callable[..., dict[str, np.ndarray]]:
    """``like_reference(op, operands, attributes, atol=...)``: see ``matches_reference``."""
    return matches_reference


@pytest.fixture
def refuses() -> Callable[..., UnsupportedModelError]:
    """``refuses(op, operands, attributes, match=...)``: see ``refused``."""
    return refused


@pytest.fixture
def one_node_graph() -> Callable[..., Model]:
    """``one_node_graph(op, operands, attributes)``: see ``node_model``."""
    return node_model
