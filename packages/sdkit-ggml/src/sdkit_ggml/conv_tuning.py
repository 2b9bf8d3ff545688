"""Times a conv shape's lowerings on the device at compile time (``conv="auto"``): the
``timer`` the backend hands a compiled model's ``ConvChooser`` (this module compiles micro-models,
so it sits above ``compiled`` in the layers).

Each candidate runs a micro-graph (one Conv node, random weights) compiled with that strategy
forced, on the model's own backend and thread count: one warm-up, then ``RUNS`` timed runs,
median. A map so big that one run would take long is timed on a band of its rows (conv time is
linear in output rows). Direct is kept only when its output matches im2col's (rel-L2
``EXACT``). The answer is stored in sdkit's artifact cache (key: the shape, ggml's version and
library folder, the device, the thread count), so the next compile on this machine reuses it;
shapes below ``MIN_MACS`` are not timed (im2col), and the timing of one compile stops after
``$SDKIT_GGML_CONV_TUNE_S`` seconds (default 60; later shapes take im2col, uncached).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from sdkit.cache import ArtifactCache, make_key
from sdkit.model import Model
from sdkit.options import Options
from sdkit_ggml.compiled import GgmlCompiledModel
from sdkit_ggml.compiler.conv_strategy import ConvShape
from sdkit_ggml.converter_plugins import default_registry
from sdkit_ggml.runtime import lib as L

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit_ggml.runtime.lib import GgmlLib

BUDGET_ENV = "SDKIT_GGML_CONV_TUNE_S"
DEFAULT_BUDGET_S = 60.0
MIN_MACS = 20_000_000  # ~10 ms at one thread: a choice there cannot matter
BAND_MACS = 1_500_000_000  # at most this much work per timed run
RUNS = 3
EXACT = 1e-5
STRATEGIES = ("im2col", "direct")

MEASURED: list[str] = []  # every shape timed in this process (tests observe reuse through it)


def micro_model(shape: ConvShape, max_macs: int = BAND_MACS) -> tuple[Model, np.ndarray]:
    """A one-Conv model of ``shape`` (a band of its rows when it is over ``max_macs``) and an
    input for it."""
    n, c, h, w = shape.input
    oc, _, kh, kw = shape.kernel
    rows = shape.out_hw[0]
    if shape.macs > max_macs:
        rows = max(1, rows * max_macs // shape.macs)
    need = (rows - 1) * shape.stride[0] + shape.dilation[0] * (kh - 1) + 1 - 2 * shape.pad[0]
    h = max(1, min(h, need))
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((oc, c, kh, kw), dtype=np.float32) * np.float32((c * kh * kw) ** -0.5)
    pads = [shape.pad[0], shape.pad[1], shape.pad[0], shape.pad[1]]
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], strides=list(shape.stride), pads=pads, dilations=list(shape.dilation)
    )
    graph = helper.make_graph(
        [node],
        "conv_tuning",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return Model.from_proto(proto), rng.standard_normal((n, c, h, w), dtype=np.float32)


@dataclass
class ConvTuner:
    """The ``timer`` of a ``ConvChooser``: cached timings, else measured now."""

    lib: GgmlLib
    backend: int
    device: Device
    threads: int
    options: Options
    budget_s: float = field(default_factory=lambda: float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S)))
    spent_s: float = 0.0

    def key(self, shape: ConvShape) -> dict[str, object]:
        return make_key(
            graph_hash=f"conv {shape.describe()}",
            backend="ggml-conv-strategy",
            backend_version=f"{self.lib.version} {self.lib.directory}",
            device=str(self.device),
            options={"threads": self.threads},
        )

    def __call__(self, shape: ConvShape) -> dict[str, float] | None:
        if shape.macs < MIN_MACS:
            return None
        if not self.options.cache:
            return self._measure(shape)
        found = ArtifactCache().lookup(self.key(shape))
        if found is not None:
            return _read(found)
        times = self._measure(shape)
        if times is not None:
            ArtifactCache().store(self.key(shape), lambda folder: _write(folder, times))
        return times

    def _measure(self, shape: ConvShape) -> dict[str, float] | None:
        if self.spent_s >= self.budget_s:
            return None
        start = time.perf_counter()
        MEASURED.append(shape.describe())
        model, x = micro_model(shape)
        times: dict[str, float] = {}
        outputs: dict[str, np.ndarray] = {}
        for strategy in STRATEGIES:
            times[strategy], outputs[strategy] = self._time(model, x, strategy, shape.kernel_type)
        reference = outputs["im2col"]
        error = float(np.linalg.norm(outputs["direct"] - reference) / max(float(np.linalg.norm(reference)), 1e-30))
        if not error <= EXACT:
            times.pop("direct")
        self.spent_s += time.perf_counter() - start
        return times

    def _time(self, model: Model, x: np.ndarray, strategy: str, kernel_type: int) -> tuple[float, np.ndarray]:
        precision = "fp16" if kernel_type == L.GGML_TYPE_F16 else "fp32"
        options = replace(self.options, precision=precision, extra={**self.options.extra, "conv": strategy})
        compiled = GgmlCompiledModel(
            model.graph, model.weights, self.device, options,
            lib=self.lib, backend=self.backend, registry=default_registry(),
        )  # fmt: skip
        try:
            y = compiled.run({"x": x})["y"]  # warm-up (and the graph's allocation)
            runs = []
            for _ in range(RUNS):
                start = time.perf_counter()
                compiled.run({"x": x})
                runs.append(time.perf_counter() - start)
            return statistics.median(runs), y
        finally:
            compiled.close()


def _write(folder: Path, times: dict[str, float]) -> None:
    (folder / "conv-strategy.json").write_text(json.dumps(times, sort_keys=True))


def _read(folder: Path) -> dict[str, float]:
    raw = json.loads((folder / "conv-strategy.json").read_text())
    return {str(k): float(v) for k, v in raw.items()}
