"""Bad shapes never abort the process: every conformance model that runs, with its input dims
made symbolic, is fed randomly perturbed shapes (ggml would GGML_ASSERT on many of them).
Each run must succeed or raise an SdkitError; a native abort fails the whole pytest run."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import onnx

import sdkit
from sdkit.errors import SdkitError
from sdkit.model import Model
from sdkit.testing import load_exclusions

EXCLUSIONS = Path(__file__).with_name("conformance_exclusions.txt")


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    initializers = {t.name for t in proto.graph.initializer}
    for vi in proto.graph.input:
        if vi.name in initializers:
            continue
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            dim.Clear()
            dim.dim_param = f"{vi.name}_{k}"
    for vi in proto.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return proto


def _feeds(model: onnx.ModelProto, compiled: sdkit.CompiledModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for info in compiled.inputs:
        original = next(vi for vi in model.graph.input if vi.name == info.name)
        shape = [d.dim_value for d in original.type.tensor_type.shape.dim]
        shape = [max(0, s + int(rng.integers(-1, 3))) if rng.random() < 0.6 else s for s in shape]
        if info.dtype.kind == "f":
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
        elif info.dtype.kind == "b":
            feeds[info.name] = rng.random(shape) < 0.5
        else:
            feeds[info.name] = rng.integers(-3, 5, shape).astype(info.dtype)
    return feeds


def test_perturbed_shapes_never_abort() -> None:
    from onnx.backend.test.loader import load_model_tests

    excluded = [re.compile(p) for p, _ in load_exclusions(EXCLUSIONS)]
    rng = np.random.default_rng(0)
    tried = 0
    for case in load_model_tests(kind="node"):
        name = f"{case.name}_cpu"
        if case.model is None or any(p.search(name) for p in excluded):
            continue
        try:
            compiled = sdkit.compile(Model.from_proto(_symbolic(case.model)), backend="ggml")
        except SdkitError:
            continue
        for _ in range(2):
            with contextlib.suppress(SdkitError):
                compiled.run(_feeds(case.model, compiled, rng))
            tried += 1
    assert tried > 1000
