"""Compile without running: lower a model for given feeds into ggml contexts, then free them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from sdkit.errors import SdkitError
from sdkit.model import Model
from sdkit_ggml.compiler.build import build_plan, capacity_for
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import NeedsValue
from sdkit_ggml.compiler.passes import apply_passes
from sdkit_ggml.converter_plugins import default_registry
from sdkit_ggml.runtime.context import GgmlContext
from sdkit_ggml.runtime.lib import load_library


def lower(model: Model, feeds: Mapping[str, np.ndarray]) -> SdkitError | None:
    """What compile decides for these feeds: None when the graph lowers, else its error. Inputs
    used as shapes or axes are compiled in as values, as ``GgmlCompiledModel`` does."""
    lib = load_library()
    proto = apply_passes(model.graph.proto)
    specs = {i.name: (tuple(np.shape(feeds[i.name])), np.asarray(feeds[i.name]).dtype) for i in model.inputs}
    constants = {name: np.asarray(model.weights[name]) for name in model.graph.initializer_names}
    values: dict[str, np.ndarray] = {}
    while True:
        context = GgmlContext(lib, capacity_for(proto))
        try:
            # weight arrays are not kept: nothing is uploaded, only the decisions matter
            builder = Builder(context, keep_weights=False)
            build_plan(proto, constants, specs, default_registry(), builder, value_inputs=values)
        except NeedsValue as need:
            values[need.name] = np.asarray(feeds[need.name])
        except SdkitError as exc:
            return exc
        else:
            return None
        finally:
            context.free()


@pytest.fixture
def compile_without_running() -> Callable[[Model, Mapping[str, np.ndarray]], SdkitError | None]:
    return lower
