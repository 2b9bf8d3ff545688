"""Helpers of sdkit-coreml's tests (a uniquely named module: several packages' tests share
one pytest session under --import-mode=importlib)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from sdkit.model import Model, load_onnx

REPO = Path(__file__).resolve().parents[3]
FIXTURES = ("taef2_encoder", "taef2_decoder", "sd15_vae_decoder", "tiny_unet", "tiny_clip_text", "tiny_controlnet")


def runtime_missing() -> str:
    """Why Core ML cannot run here ('' where it can)."""
    from sdkit_coreml.runtime import runtime_available

    ok, why = runtime_available()
    return "" if ok else why


def needs_coremltools() -> None:
    if importlib.util.find_spec("coremltools") is None:
        pytest.skip("coremltools is not installed (pip install -e 'packages/sdkit-coreml[test]')")


def fixture_model(name: str, sd_graphs: ModuleType, taef2: Path) -> tuple[Model, dict[str, np.ndarray]]:
    """A fixture graph with its weights, and example inputs (256 px images / 32x32 latents)."""
    rng = np.random.default_rng(0)
    if name == "taef2_encoder":
        return load_onnx(taef2 / "taef2_encoder.onnx"), {"image": rng.random((1, 3, 256, 256), np.float32)}
    if name == "taef2_decoder":
        latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :32, :32]
        return load_onnx(taef2 / "taef2_decoder.onnx"), {"latent": np.ascontiguousarray(latent)}
    return Model.from_proto(sd_graphs.load_model(name, seed=0)), sd_graphs.example_inputs(name)


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, feeds)]


def graph_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[Any]]],
    outputs: list[tuple[str, int, list[Any] | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> Model:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def fold_with_mil(model: Model, target: str = "macOS13", ops: list[str] | None = None) -> dict[str, np.ndarray | None]:
    """Translate a graph without inputs (initializers only) and let MIL's own value inference
    (coremltools' numpy implementation of each MIL op) compute every output: an oracle for
    the translation's semantics that needs no Core ML runtime. None where MIL cannot fold.
    ``ops`` collects the MIL op types created (dead ones included)."""
    from coremltools.converters.mil.mil import Function

    from sdkit_coreml.program import context_for, translate_nodes
    from sdkit_coreml.runtime import target_named
    from sdkit_coreml.translate.builtin import load_converters

    chosen = target_named(target)
    ctx = context_for(model.graph, dict(model.weights), chosen)
    with Function({}, opset_version=chosen.mil_opset) as function:
        translate_nodes(ctx, model.graph.nodes, load_converters())
        values = {o.name: ctx.value(ctx.get(o.name)) for o in model.graph.outputs}
        if ops is not None:
            ops.extend(op.op_type for op in function.operations)
        return values
