"""``OpenVinoCompiled``: one converted model, compiled per input-shape signature.

OpenVINO runs fastest on static shapes. A graph whose inputs are all fixed is compiled at
once; a graph with symbolic dims is reshaped to each call's shapes and compiled on first use
of that signature, then reused. ``refit`` swaps the weights by converting the same graph with
the new weights and recompiling every signature already built (OpenVINO has no in-place
weight update for compiled CPU models); ``info`` records what each step cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.engine_cache import EngineCache
from sdkit.errors import InputError, SdkitError, UnsupportedOperatorError
from sdkit_openvino.blob_cache import verified_cache_dir
from sdkit_openvino.config import cache_dir, cache_key, compile_properties, effective_precision, warn_precision
from sdkit_openvino.convert import Converted, convert
from sdkit_openvino.index_checks import check_indices, index_bounds
from sdkit_openvino.runtime import BACKEND_NAME, first_line, get_core, openvino_version
from sdkit_openvino.tensors import from_ov, to_ov

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options
    from sdkit_openvino.runtime import OvDevice

Signature = tuple[tuple[int, ...], ...]  # input shapes, in the graph's input order


@dataclass
class Engine:
    """A compiled model for one signature and the infer request that runs it."""

    compiled: Any
    request: Any
    input_index: dict[str, int]  # graph input -> OpenVINO input index (unused inputs absent)
    output_index: list[int]  # graph output i -> OpenVINO output index
    lock: threading.Lock


class OpenVinoCompiled(CompiledModel):
    def __init__(self, graph: Graph, weights: WeightSet, device: OvDevice, options: Options) -> None:
        self.graph = graph
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        self.device = device.device
        self._ov_device = device
        self._options = options
        self._engines: EngineCache[Signature, Engine] = EngineCache()
        self.info: dict[str, Any] = {
            "device": device.vendor_name,
            "precision_requested": options.precision,
            "compiles": [],
        }
        start = time.perf_counter()
        self._converted: Converted = convert(graph, weights)
        self._index_bounds = index_bounds(graph)  # OpenVINO zero-fills out-of-range Gathers
        self.info["convert_seconds"] = time.perf_counter() - start
        static = [i.shape for i in self.inputs if all(isinstance(d, int) and d >= 0 for d in i.shape)]
        if len(static) == len(self.inputs):
            self._engine(tuple(tuple(int(d) for d in s) for s in static))  # type: ignore[arg-type]

    # -- compiling -------------------------------------------------------------------------
    def _build(self, converted: Converted, signature: Signature) -> Engine:
        import openvino as ov

        core = get_core()
        shapes = {info.name: list(shape) for info, shape in zip(self.inputs, signature, strict=True)}
        model = converted.model.clone()
        # Reshape only inputs whose shape differs: revalidating an already static graph can
        # fail where the original conversion passed (Pad with a [1]-shaped pad value).
        changed: dict[int, Any] = {}
        for name, index in converted.input_index.items():
            current = model.inputs[index].get_partial_shape()
            if not (current.is_static and list(current.to_shape()) == shapes[name]):
                changed[index] = ov.PartialShape(shapes[name])
        try:
            if changed:
                model.reshape(changed)
        except Exception as exc:
            raise InputError(f"these input shapes do not fit the model ({shapes}): {first_line(exc)}") from None
        cache = None
        if self._options.cache:
            cache = cache_dir(cache_key(self.graph.hash, openvino_version(), self._ov_device, self._options, shapes))
        supported = list(core.get_property(self._ov_device.vendor_name, "SUPPORTED_PROPERTIES"))
        # blobs checked against sdkit's sums before OpenVINO may import them (blob_cache.py)
        with verified_cache_dir(cache) as usable_cache:
            props = compile_properties(self._ov_device, self._options, supported, usable_cache)
            start = time.perf_counter()
            try:
                compiled = core.compile_model(model, self._ov_device.vendor_name, props)
            except Exception as exc:
                self._raise_unsupported(model)
                raise SdkitError(
                    f"OpenVINO failed to compile the model for {self._ov_device.vendor_name}: {first_line(exc)}"
                ) from None
            seconds = time.perf_counter() - start
        self._record(compiled, shapes, seconds, usable_cache is not None)
        return Engine(
            compiled, compiled.create_infer_request(), converted.input_index, converted.output_index, threading.Lock()
        )

    def _raise_unsupported(self, model: Any) -> None:
        """After a failed compile: name the nodes the device plugin lacks, if it says which."""
        from sdkit_openvino.support import device_gaps

        try:
            gaps = device_gaps(self.graph, model, self._ov_device.vendor_name)
        except Exception:  # query_model failing too: fall back to the compile error
            return
        if gaps:
            raise UnsupportedOperatorError(BACKEND_NAME, gaps)

    def _record(self, compiled: Any, shapes: dict[str, list[int]], seconds: float, cached: bool) -> None:
        try:
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            reported = str(hint.get_type_name() if hasattr(hint, "get_type_name") else hint)  # "f32", "bf16"
        except Exception:  # a device without the property runs its default precision
            reported = None
        ran, note = effective_precision(self._options.precision, self._ov_device.capabilities, reported)
        if note and not self.info.get("precision_note"):
            warn_precision(note)
        self.info.update(precision=ran, precision_note=note)
        try:
            self.info["threads"] = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        except Exception:
            self.info["threads"] = None
        try:
            from_cache = bool(compiled.get_property("LOADED_FROM_CACHE")) if cached else False
        except Exception:
            from_cache = False
        self.info["compiles"].append({"shapes": shapes, "seconds": seconds, "from_cache": from_cache})

    def _engine(self, signature: Signature) -> Engine:
        return self._engines.get_or_build(signature, lambda sig: self._build(self._converted, sig))

    # -- running ---------------------------------------------------------------------------
    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_indices(self._index_bounds, feeds)
        engine = self._engine(tuple(tuple(int(d) for d in feeds[i.name].shape) for i in self.inputs))
        with engine.lock:
            try:
                engine.request.infer(
                    {
                        index: to_ov(feeds[name], engine.compiled.input(index).get_element_type())
                        for name, index in engine.input_index.items()
                    }
                )
            except Exception as exc:
                raise InputError(f"OpenVINO failed to run the model on these inputs: {first_line(exc)}") from None
            results: dict[str, np.ndarray] = {}
            for info, position in zip(self.outputs, engine.output_index, strict=True):
                results[info.name] = from_ov(engine.request.get_output_tensor(position), info.dtype)
        return results

    # -- weights ---------------------------------------------------------------------------
    def refit(self, weights: WeightSet) -> None:
        """Swap every weight: convert the same graph with ``weights`` and recompile each
        signature built so far (from OpenVINO's cache where the blob for these weights exists)."""
        start = time.perf_counter()
        converted = convert(self.graph, weights)

        def commit() -> None:
            self._converted = converted

        self._engines.rebuild(lambda sig: self._build(converted, sig), commit)
        self.info["refit_seconds"] = time.perf_counter() - start

    def close(self) -> None:
        self._engines.clear()

    @property
    def signatures(self) -> list[Mapping[str, tuple[int, ...]]]:
        """The input shapes compiled so far."""
        return [{i.name: s for i, s in zip(self.inputs, sig, strict=True)} for sig in self._engines]
