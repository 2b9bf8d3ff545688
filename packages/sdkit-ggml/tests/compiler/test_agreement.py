"""check() and compile decide alike, node by node.

check() runs the compile walk over shapes alone (``compiler/check.py``). For every node of the
SD fixture graphs and every onnx.backend.test node case: a graph check() refuses does not
compile; a graph check() accepts with every node decided compiles; where check() left a node
to compile (it needs a weight's or an input's value, or an input shape is symbolic), compile
may refuse that node only. "Compile" lowers the graph for the case's own inputs without
running it (``compile_without_running``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from sdkit.errors import SdkitError, UnsupportedModelError, UnsupportedNode
from sdkit.model import Graph, Model, WeightSet
from sdkit_ggml.compiler.check import GraphCheck, check_graph
from sdkit_ggml.converter_plugins import default_registry

Lower = Callable[[Model, dict[str, np.ndarray]], SdkitError | None]


def _node_cases() -> Iterator[tuple[str, Model | None, dict[str, np.ndarray] | None]]:
    """(name, model, feeds) per node case; feeds None where an input is not a tensor."""
    from onnx.backend.test.loader import load_model_tests

    for case in load_model_tests(kind="node"):  # generated once per process, cached by onnx
        try:
            model = Model.from_proto(case.model)
        except SdkitError:
            yield case.name, None, None
            continue
        values = list(case.data_sets[0][0]) if case.data_sets else []
        feeds: dict[str, np.ndarray] | None = {}
        for info, raw in zip(model.inputs, values, strict=False):
            value = numpy_helper.to_array(raw) if isinstance(raw, onnx.TensorProto) else raw
            if not isinstance(value, np.ndarray | np.generic) or feeds is None:
                feeds = None
                continue
            feeds[info.name] = np.asarray(value)
        if feeds is not None and len(feeds) != len(model.inputs):
            feeds = None
        yield case.name, model, feeds


def _refused_nodes(error: SdkitError) -> set[str]:
    """The nodes compile names (a graph input as check() names it: ``input NAME``)."""
    names = set()
    for problem in error.problems if isinstance(error, UnsupportedModelError) else []:
        if isinstance(problem, UnsupportedNode):
            names.add(problem.node)
        elif str(problem).startswith("input '"):
            names.add(f"input {str(problem).split(chr(39))[1]}")
    return names


def verdict(result: GraphCheck, error: SdkitError | None) -> str:
    """How check() and compile relate on one graph; the names in capitals are disagreements."""
    left_to_compile = set(result.deferred) | set(result.shape_free)
    if result.unsupported:
        if error is None:
            return "REFUSED BUT COMPILES"
        # compile stops at its first refusal: a node check() refused or left to compile
        seen = {u.node for u in result.unsupported} | left_to_compile
        return "refused by both" if _refused_nodes(error) & seen else "REFUSED ELSEWHERE"
    if error is None:
        return "compiles, decided at compile time" if left_to_compile else "accepted by both"
    if _refused_nodes(error) & left_to_compile:
        return "refused at compile time, as check() left it"
    return "ACCEPTED BUT FAILS"


def test_every_node_suite_case(compile_without_running: Lower) -> None:
    registry = default_registry()
    counts: collections.Counter[str] = collections.Counter()
    disagreements = []
    for name, model, feeds in _node_cases():
        if model is None:
            counts["not a loadable model"] += 1
            continue
        result = check_graph(model.graph.proto, registry)
        if feeds is None:  # sequences, optionals: never ggml tensors
            outcome = "refused by both" if result.unsupported else "REFUSED BUT COMPILES"
        else:
            outcome = verdict(result, compile_without_running(model, feeds))
        counts[outcome] += 1
        if outcome.isupper():
            disagreements.append((name, outcome, result.unsupported[:2], list(result.deferred.items())[:2]))
    assert not disagreements, disagreements
    # the suite exercises every kind of decision (1,884 cases with onnx 1.23)
    assert counts["accepted by both"] > 500 and counts["refused by both"] > 1000, counts
    assert counts["compiles, decided at compile time"] > 100, counts


# every graph of fixtures/sd (17 s for the SD 1.5 UNet on 2 busy cores, 0.7 GB)
SD_GRAPHS = ["tiny_clip_text", "tiny_unet", "tiny_controlnet", "sd15_vae_encoder", "sd15_vae_decoder", "sd15_unet"]


def _zero_weights(sd_graphs: Any, name: str) -> Model:
    """The committed graph with zeros for its stripped (big) weights, taking no memory: check()
    defers no node of these graphs for a weight's value, so any weights decide alike."""
    proto = sd_graphs.load_graph(name)
    weights = {
        t.name: np.broadcast_to(np.zeros((), helper.tensor_dtype_to_np_dtype(t.data_type)), tuple(t.dims))
        if sd_graphs.is_stripped(t)
        else numpy_helper.to_array(t)
        for t in proto.graph.initializer
    }
    return Model(Graph(proto), WeightSet(weights))


@pytest.mark.parametrize("name", SD_GRAPHS)
def test_sd_graphs(name: str, sd_graphs: Any, compile_without_running: Lower) -> None:
    big = name == "sd15_unet"  # random weights would take 3.4 GB and minutes to make
    model = _zero_weights(sd_graphs, name) if big else Model.from_proto(sd_graphs.load_model(name))
    feeds = sd_graphs.example_inputs(name)
    registry = default_registry()
    symbolic = check_graph(model.graph.proto, registry)
    assert not symbolic.unsupported, symbolic.unsupported
    # at the shapes it will run with, check() decides every node, and compile agrees
    static = check_graph(model.graph.with_input_shapes({k: v.shape for k, v in feeds.items()}).proto, registry)
    assert not static.unsupported and not static.deferred and not static.shape_free, static.notes()
    assert verdict(static, compile_without_running(model, feeds)) == "accepted by both"
