"""``TrtCompiledModel``: engines per call signature (or one per profile set), cached and refit.

Static graphs and graphs compiled with ``profiles`` get their engine at compile time; a graph
with dynamic dims and no profiles gets one engine per call signature, built (or loaded from
the artifact cache) the first time ``run`` sees it. Every engine is weight-stripped and
refit from the model's current WeightSet when loaded, and again on ``refit``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel, TensorInfo
from sdkit.cache import ArtifactCache
from sdkit.device import Device
from sdkit.engine_cache import EngineCache
from sdkit.model import Graph, WeightSet
from sdkit.options import Options
from sdkit_trt.build import build_plan
from sdkit_trt.cuda_mem import Stream, set_device
from sdkit_trt.driver import Gpu
from sdkit_trt.engine import TrtEngine
from sdkit_trt.fp8 import Fp8Plan, convert_graph_fp8
from sdkit_trt.fp16 import Fp16Plan, convert_graph
from sdkit_trt.onnx_source import onnx_source
from sdkit_trt.runtime import RuntimeInfo
from sdkit_trt.shapes import Profiles, Shape, check_in_profiles, is_static, signature
from sdkit_trt.store import engine_key, side_cache_path
from sdkit_trt.weights import baked_digests, changed_baked, refuse_baked_change, validate_weights

PLAN_FILE = "engine.plan"
BAKED_FILE = "baked.json"
Signature = tuple[tuple[str, Shape], ...]


class _StaleEngine(Exception):
    """A cached plan whose build-time constants differ from these weights: rebuild it."""


class TrtCompiledModel(CompiledModel):
    def __init__(
        self,
        *,
        trt: ModuleType,
        runtime: RuntimeInfo,
        gpu: Gpu,
        graph: Graph,
        weights: WeightSet,
        options: Options,
        profiles: Profiles,
    ) -> None:
        self.trt, self.runtime, self.gpu = trt, runtime, gpu
        self.graph = graph
        self.inputs: list[TensorInfo] = graph.inputs
        self.outputs: list[TensorInfo] = graph.outputs
        self.device = Device("cuda", gpu.ordinal, gpu.name)
        self.options = options
        self.profiles = profiles
        self.weights = validate_weights(graph, weights)
        # fp16 and fp8 rewrite the graph and convert every weight set the same way (refit too).
        self.plan: Fp16Plan | Fp8Plan | None = None
        if options.precision == "fp16":
            self.plan = convert_graph(graph)
        elif options.precision == "fp8":
            self.plan = convert_graph_fp8(graph)
        self.cache = ArtifactCache() if options.cache else None
        # engine and its baked weights' digests, per call signature (None: static or profiles)
        self.engines: EngineCache[Signature | None, tuple[TrtEngine, dict[str, str]]] = EngineCache()
        self.cache_hits: list[bool] = []
        self._call_lock = threading.RLock()
        set_device(gpu.ordinal)
        self.stream = Stream()
        if profiles or is_static(self.inputs):
            try:
                self.engines.get_or_build(None, self._engine_for)
            except BaseException:
                self.stream.close()  # nothing else holds device resources yet
                raise

    # -- graph and weights as the engine sees them -------------------------------------
    def _engine_graph(self, sig: Signature | None) -> Graph:
        base = self.plan.graph if self.plan is not None else self.graph
        return base.with_input_shapes(dict(sig)) if sig else base

    def _engine_weights(self, weights: WeightSet) -> WeightSet:
        return self.plan.convert_weights(weights) if self.plan is not None else weights

    def _source_of(self, engine_name: str) -> str:
        return self.plan.source_of(engine_name) if self.plan is not None else engine_name

    # -- build, cache, load ------------------------------------------------------------
    def _key(self, sig: Signature | None) -> dict[str, Any]:
        return engine_key(
            graph_hash=self.graph.hash,
            runtime=self.runtime,
            gpu=self.gpu,
            precision=self.options.precision,
            input_shapes=dict(sig) if sig else None,
            profiles=self.profiles,
        )

    def _build(self, sig: Signature | None, folder: Path) -> None:
        set_device(self.gpu.ordinal)
        graph = self._engine_graph(sig)
        timing = side_cache_path("timing", self.runtime, self.gpu) if self.options.cache else None
        with onnx_source(graph, self._engine_weights(self.weights)) as source:
            plan = build_plan(
                self.trt,
                source,
                is_rtx=self.runtime.is_rtx,
                profiles=self.profiles,
                timing_cache=timing,
                precision=self.options.precision,
            )
        (folder / PLAN_FILE).write_bytes(plan)
        engine = TrtEngine(self.trt, plan, self.runtime.is_rtx, None)
        try:
            exposed = set(engine.refittable_names())
        finally:
            engine.close()
        refittable = {
            source
            for source in self.graph.initializer_names
            if all(n in exposed for n in graph.initializer_names if self._source_of(n) == source)
        }
        (folder / BAKED_FILE).write_text(json.dumps(baked_digests(self.weights, refittable), sort_keys=True))

    def _load(self, sig: Signature | None, folder: Path) -> tuple[TrtEngine, dict[str, str]]:
        baked = json.loads((folder / BAKED_FILE).read_text())
        if changed_baked(baked, self.weights):
            raise _StaleEngine
        set_device(self.gpu.ordinal)
        runtime_cache = side_cache_path("runtime", self.runtime, self.gpu) if self.options.cache else None
        engine = TrtEngine(self.trt, (folder / PLAN_FILE).read_bytes(), self.runtime.is_rtx, runtime_cache)
        try:
            with onnx_source(self._engine_graph(sig), self._engine_weights(self.weights)) as source:
                engine.refit(source, self.stream)
        except BaseException:
            engine.close()
            raise
        return engine, baked

    def _engine_for(self, sig: Signature | None) -> tuple[TrtEngine, dict[str, str]]:
        if self.cache is None:
            folder = Path(tempfile.mkdtemp(prefix="sdkit-trt-"))
            try:
                self._build(sig, folder)
                self.cache_hits.append(False)
                return self._load(sig, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        loaded, hit = self.cache.load_or_build(
            self._key(sig), lambda f: self._build(sig, f), lambda f: self._load(sig, f)
        )
        self.cache_hits.append(hit)
        return loaded

    # -- the CompiledModel contract ----------------------------------------------------
    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # One execution context, stream and staging buffers per model: one call at a time.
        with self._call_lock:
            return self._execute(feeds)

    def _execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sig: Signature | None = None
        if self.profiles:
            check_in_profiles(self.profiles, feeds)
        elif not is_static(self.inputs):
            sig = signature(feeds)
        engine, _ = self.engines.get_or_build(sig, self._engine_for)
        set_device(self.gpu.ordinal)
        outputs = engine.execute(feeds, self.stream)
        return {o.name: outputs[o.name].astype(o.dtype, copy=False) for o in self.outputs}

    def refit(self, weights: WeightSet) -> None:
        """Swap every weight (the complete set; a missing or mis-shaped one is an InputError)."""
        validated = validate_weights(self.graph, weights)
        with self._call_lock:
            self._refit(validated)

    def _refit(self, validated: WeightSet) -> None:
        for _, baked in self.engines.values():
            refuse_baked_change(changed_baked(baked, validated))
        for sig, (engine, _) in self.engines.items():
            with onnx_source(self._engine_graph(sig), self._engine_weights(validated)) as source:
                engine.refit(source, self.stream)
        self.weights = validated

    def close(self) -> None:
        with self._call_lock:
            self._close()

    def _close(self) -> None:
        self.engines.clear(lambda built: built[0].close())
        if getattr(self, "stream", None) is not None:
            self.stream.close()
