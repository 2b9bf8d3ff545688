"""An sdkit backend on onnxruntime's CPU provider: the plugin guide's example, complete."""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import numpy as np

from sdkit import Availability, Backend, CompiledModel, Device, Graph, Options, SupportReport, WeightSet
from sdkit.errors import InputError
from sdkit.plugins import BackendRegistry, hookimpl


class OrtCompiled(CompiledModel):
    def __init__(self, graph: Graph, weights: WeightSet, options: Options) -> None:
        import onnxruntime as ort  # lazily: the hook module must stay import-light

        self.graph, self.inputs, self.outputs = graph, graph.inputs, graph.outputs
        self._ort, self._options = ort, options
        self.refit(weights)

    def refit(self, weights: WeightSet) -> None:
        so = self._ort.SessionOptions()
        if self._options.threads:
            so.intra_op_num_threads = self._options.threads
        model = self.graph.to_onnx(weights).SerializeToString()
        self._session = self._ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            results = self._session.run(None, feeds)
        except Exception as exc:  # onnxruntime raises its own types for bad shapes
            raise InputError(f"onnxruntime: {exc}") from None
        return {o.name: r for o, r in zip(self.outputs, results, strict=True)}


class OrtBackend(Backend):
    name: ClassVar[str] = "onnxruntime"
    priority: ClassVar[int] = 40

    def probe(self) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability(False, "onnxruntime is not installed", "pip install onnxruntime")
        from importlib.metadata import version

        return Availability(True, version=version("onnxruntime"))

    def devices(self) -> list[Device]:
        return [Device("cpu")]

    def check(self, graph: Graph) -> SupportReport:
        return SupportReport(self.name)  # onnxruntime runs every standard op

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        return OrtCompiled(graph, weights, options)


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    registry.add(OrtBackend)
