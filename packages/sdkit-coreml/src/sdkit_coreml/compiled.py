"""``CoremlCompiled``: ``.mlpackage`` files loaded into Core ML (macOS only), run on numpy.

Without flexible shapes one package is converted per call signature (static shapes), on
first use, through sdkit's artifact cache; with ``enumerated_shapes`` / ``shape_ranges`` one
package serves every allowed shape. Core ML has no int64 tensors: int64 feeds are narrowed to
int32 (refused when a value does not fit), bool feeds sent as float32, and outputs cast back
to the graph's dtypes. ``refit``
re-converts with the new weights (the package embeds them) and reloads; ``info`` records what
each conversion cost.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.cache import ArtifactCache
from sdkit.engine_cache import EngineCache
from sdkit.errors import InputError, SdkitError
from sdkit_coreml.package import Package, cached_package
from sdkit_coreml.runtime import first_line, import_coremltools

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit_coreml.settings import Settings

Signature = tuple[tuple[int, ...], ...]
INT32 = np.iinfo(np.int32)


def narrow(name: str, array: np.ndarray) -> np.ndarray:
    """A feed as Core ML takes it: int64 -> int32 (values must fit); bool -> float32 (Core ML
    has no bool inputs: coremltools declares them float32 and casts inside the program)."""
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    if array.dtype == np.int64:
        if array.size and (array.min() < INT32.min or array.max() > INT32.max):
            raise InputError(f"input {name!r} has values outside int32, which is all Core ML takes")
        return array.astype(np.int32)
    return array


@dataclass
class Engine:
    package: Package
    model: Any  # coremltools.models.MLModel, loaded with the compute units
    lock: threading.Lock


class CoremlCompiled(CompiledModel):
    def __init__(self, graph: Graph, weights: WeightSet, device: Device, settings: Settings, cache: bool) -> None:
        self.graph = graph
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        self.device = device
        self._weights = weights
        self._settings = settings
        self._cache = ArtifactCache() if cache else None
        self._scratch = tempfile.TemporaryDirectory(prefix="sdkit-coreml-")
        self._engines: EngineCache[Signature | None, Engine] = EngineCache()
        self.info: dict[str, Any] = {
            "compute_units": settings.compute_units,
            "precision": settings.precision,
            "target": settings.target.name,
            "conversions": [],
        }
        static = all(isinstance(d, int) and d >= 0 for i in self.inputs for d in i.shape)
        if settings.flexible:
            self._engine(None)
        elif static:
            self._engine(tuple(tuple(int(d) for d in i.shape) for i in self.inputs))  # type: ignore[arg-type]

    def _build(self, weights: WeightSet, signature: Signature | None) -> Engine:
        graph, shapes = self.graph, None
        if signature is not None:
            shapes = {i.name: s for i, s in zip(self.inputs, signature, strict=True)}
            graph = graph.with_input_shapes(shapes)
        scratch = Path(self._scratch.name) / str(len(self.info["conversions"]))
        package = cached_package(graph, weights, self._settings, shapes, self._cache, scratch)
        ct = import_coremltools()
        start = time.perf_counter()
        try:
            model = ct.models.MLModel(str(package.path), compute_units=ct.ComputeUnit[self._settings.compute_units])
        except Exception as exc:
            raise SdkitError(f"Core ML failed to load the converted model: {first_line(exc)}") from None
        self.info["conversions"].append(
            {
                "shapes": shapes,
                "convert_seconds": package.seconds,
                "load_seconds": time.perf_counter() - start,
                "from_cache": package.cached,
            }
        )
        return Engine(package, model, threading.Lock())

    def _engine(self, signature: Signature | None) -> Engine:
        return self._engines.get_or_build(signature, lambda sig: self._build(self._weights, sig))

    def _signature(self, feeds: dict[str, np.ndarray]) -> Signature | None:
        if not self._settings.flexible:
            return tuple(tuple(int(d) for d in feeds[i.name].shape) for i in self.inputs)
        for name, flexible in self._settings.flexible.items():
            if not flexible.accepts(feeds[name].shape):
                raise InputError(f"input {name!r} has shape {list(feeds[name].shape)}, outside {flexible.key()}")
        return None

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        engine = self._engine(self._signature(feeds))
        names = engine.package.names
        coreml_feeds = {names.inputs[k]: narrow(k, v) for k, v in feeds.items()}
        with engine.lock:
            try:
                results = engine.model.predict(coreml_feeds)
            except Exception as exc:
                raise InputError(f"Core ML failed to run the model on these inputs: {first_line(exc)}") from None
        return {
            info.name: np.asarray(results[names.outputs[info.name]]).astype(info.dtype, copy=False)
            for info in self.outputs
        }

    def refit(self, weights: WeightSet) -> None:
        """New weights: re-convert every package built so far (cache hits for weights seen
        before) and reload them."""
        start = time.perf_counter()

        def commit() -> None:
            self._weights = weights

        self._engines.rebuild(lambda sig: self._build(weights, sig), commit)
        self.info["refit_seconds"] = time.perf_counter() - start

    def close(self) -> None:
        self._engines.clear()
        self._scratch.cleanup()
