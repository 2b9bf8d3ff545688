"""The ``reference`` backend: ``onnx.reference.ReferenceEvaluator``.

Slow and exact; never chosen automatically for speed. It is the oracle in tests and the
fallback where no runtime is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnx

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.device import CPU, Device
from sdkit.errors import DeviceError, InputError, OptionError, ResourceLimitError, SdkitError, UnsupportedNode

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


class ReferenceCompiled(CompiledModel):
    def __init__(self, graph: Graph, weights: WeightSet) -> None:
        self.graph = graph
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        self.device = CPU
        self._build(weights)

    def _build(self, weights: WeightSet) -> None:
        from onnx.reference import ReferenceEvaluator

        try:
            self._evaluator = ReferenceEvaluator(self.graph.to_onnx(weights))
        except SdkitError:
            raise
        except Exception as exc:
            raise SdkitError(f"onnx.reference cannot load this model: {exc}") from None

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            results = self._evaluator.run(None, feeds)
        except MemoryError as exc:  # numpy could not allocate a tensor (a size check missed it)
            raise ResourceLimitError(f"reference backend ran out of memory: {exc}") from None
        except Exception as exc:  # shape errors inside numpy kernels and the like
            raise InputError(f"reference backend failed to run: {type(exc).__name__}: {exc}") from None
        return {o.name: np.asarray(r) if o.kind == "tensor" else r for o, r in zip(self.outputs, results, strict=True)}

    def refit(self, weights: WeightSet) -> None:
        missing = self.graph.initializer_names - set(weights)
        if missing:
            raise InputError(f"refit: weights are missing {sorted(missing)[0]!r}")
        self._build(weights)


class ReferenceBackend(Backend):
    name: ClassVar[str] = "reference"
    priority: ClassVar[int] = 0
    description: ClassVar[str] = "onnx.reference (numpy): exact, slow; the test oracle"
    # fp16/bf16 are accepted and run in fp32 (exact); q8_0 and fp8 (quantized weights) are refused
    precisions: ClassVar[tuple[str, ...] | None] = ("fp32", "fp16", "bf16")

    def probe(self) -> Availability:
        return Availability(True, "onnx.reference is part of onnx", version=onnx.__version__)

    def devices(self) -> list[Device]:
        return [Device("cpu", description="numpy")]

    def check(self, graph: Graph) -> SupportReport:
        from onnx.reference.ops import load_op

        report = SupportReport(self.name)
        opsets = {e.domain or "": e.version for e in graph.proto.opset_import}
        seen: dict[tuple[str, str], str | None] = {}
        for node in graph.nodes:
            key = (node.domain or "", node.op_type)
            if key not in seen:
                try:
                    load_op(key[0], key[1], opsets.get(key[0], 1))
                    seen[key] = None
                except Exception as exc:
                    seen[key] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            why = seen[key]
            if why is not None:
                report.unsupported.append(UnsupportedNode(node.name, node.op_type, key[0], opsets.get(key[0], 1), why))
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        if device.kind != "cpu":
            raise DeviceError(f"the reference backend runs on cpu only, not {device}")
        if options.precision in ("q8_0", "fp8"):  # quantized weight formats; fp16/bf16 requests run in fp32
            owner = "ggml's" if options.precision == "q8_0" else "tensorrt's"
            precision = options.precision
            raise OptionError(f"the reference backend has no quantized weights (precision {precision!r} is {owner})")
        return ReferenceCompiled(graph, weights)
