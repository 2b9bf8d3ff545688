"""``MigraphxCompiled``: one MIGraphX program per input-shape signature, through the cache.

MIGraphX compiles static shapes: ``parse_onnx(map_input_dims=...)`` fixes every input's dims
to the call's shapes, ``quantize_fp16`` runs for fp16, then ``compile(get_target("gpu"),
offload_copy=True)``; the program is saved as ``.mxr`` (msgpack) in sdkit's artifact cache
and loaded from there next time. ``run`` feeds numpy arrays and copies the results out.
``refit`` recompiles every signature with the new weights (MIGraphX has no weight update).
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.cache import ArtifactCache
from sdkit.engine_cache import EngineCache
from sdkit.errors import InputError, ModelFormatError, SdkitError, UnsupportedOperatorError
from sdkit_migraphx.runtime import BACKEND_NAME, first_line, migraphx_version
from sdkit_migraphx.settings import Settings, program_key

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet

Signature = tuple[tuple[int, ...], ...]
PROGRAM = "model.mxr"


@dataclass
class Engine:
    program: Any
    parameters: list[str]  # the program's parameter names (unused inputs are dropped)
    lock: threading.Lock


def parse_error(graph: Graph, exc: Exception) -> SdkitError:
    """MIGraphX parser failure -> sdkit error; an unknown operator names every node of it."""
    from sdkit_migraphx.support import check_graph

    message = first_line(exc)
    if "Unknown operator" in message:
        problems = check_graph(graph).unsupported
        if problems:
            return UnsupportedOperatorError(BACKEND_NAME, problems)
        return UnsupportedOperatorError(BACKEND_NAME, [message])
    return ModelFormatError(f"MIGraphX cannot parse this ONNX model: {message}")


class MigraphxCompiled(CompiledModel):
    def __init__(
        self, migraphx: ModuleType, graph: Graph, weights: WeightSet, device: Device, settings: Settings, cache: bool
    ) -> None:
        self._mx = migraphx
        self.graph = graph
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        self.device = device
        self._weights = weights
        self._settings = settings
        self._cache = ArtifactCache() if cache else None
        self._engines: EngineCache[Signature, Engine] = EngineCache()
        self.info: dict[str, Any] = {"precision": settings.precision, "fast_math": settings.fast_math, "compiles": []}
        if all(isinstance(d, int) and d >= 0 for i in self.inputs for d in i.shape):
            self._engine(tuple(tuple(int(d) for d in i.shape) for i in self.inputs))  # type: ignore[arg-type]

    # -- compiling -------------------------------------------------------------------------
    def _compile(self, weights: WeightSet, shapes: dict[str, list[int]], folder: Path | None) -> Any:
        """Parse, (quantize,) compile; saved as ``folder/model.mxr`` when a folder is given."""
        mx = self._mx
        with tempfile.TemporaryDirectory(prefix="sdkit-migraphx-") as scratch:
            onnx_path = self.graph.save(Path(scratch) / "model.onnx", weights)  # external data when large
            try:
                program = mx.parse_onnx(str(onnx_path), map_input_dims=shapes)
            except Exception as exc:
                raise parse_error(self.graph, exc) from None
        if self._settings.precision == "fp16":
            mx.quantize_fp16(program)
        try:
            program.compile(
                mx.get_target("gpu"),
                offload_copy=self._settings.offload_copy,
                fast_math=self._settings.fast_math,
                exhaustive_tune=self._settings.exhaustive_tune,
            )
        except Exception as exc:
            raise SdkitError(f"MIGraphX failed to compile the model for {self.device}: {first_line(exc)}") from None
        if folder is not None:
            mx.save(program, str(folder / PROGRAM), format="msgpack")
        return program

    def _build(self, weights: WeightSet, signature: Signature) -> Engine:
        shapes = {i.name: list(s) for i, s in zip(self.inputs, signature, strict=True)}
        start = time.perf_counter()
        program, cached = None, False
        if self._cache is None:
            program = self._compile(weights, shapes, None)
        else:
            key = program_key(
                graph_hash=self.graph.hash,
                weights_hash=weights.hash(),
                version=migraphx_version(self._mx),
                gfx=self.device.description or str(self.device),
                settings=self._settings,
                input_shapes=shapes,
            )
            program, cached = self._from_cache(key), True
            if program is None:
                built: list[Any] = []
                # (the program just compiled is used as is: reloading the .mxr would cost time)
                self._cache.store(key, lambda folder: built.append(self._compile(weights, shapes, folder)))
                program, cached = built[0], False
        self.info["compiles"].append({"shapes": shapes, "seconds": time.perf_counter() - start, "from_cache": cached})
        return Engine(program, list(program.get_parameter_names()), threading.Lock())

    def _from_cache(self, key: dict[str, Any]) -> Any:
        """The cached program, or None; an entry that fails to load is dropped."""
        assert self._cache is not None
        folder = self._cache.lookup(key)
        if folder is None:
            return None
        try:
            return self._mx.load(str(folder / PROGRAM), format="msgpack")
        except Exception:  # written by another MIGraphX build, or damaged
            self._cache.invalidate(key)
            return None

    def _engine(self, signature: Signature) -> Engine:
        return self._engines.get_or_build(signature, lambda sig: self._build(self._weights, sig))

    # -- running ---------------------------------------------------------------------------
    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        engine = self._engine(tuple(tuple(int(d) for d in feeds[i.name].shape) for i in self.inputs))
        params = {name: feeds[name] for name in engine.parameters if name in feeds}
        with engine.lock:
            try:
                results = engine.program.run(params)
            except Exception as exc:
                raise InputError(f"MIGraphX failed to run the model on these inputs: {first_line(exc)}") from None
        if len(results) != len(self.outputs):
            raise ModelFormatError(f"MIGraphX returned {len(results)} outputs, the model has {len(self.outputs)}")
        return {
            info.name: np.array(result, copy=True).astype(info.dtype, copy=False)
            for info, result in zip(self.outputs, results, strict=True)
        }

    # -- weights ---------------------------------------------------------------------------
    def refit(self, weights: WeightSet) -> None:
        """New weights: recompile every signature built so far (cache hits for weights seen
        before); MIGraphX bakes weights into the compiled program."""
        start = time.perf_counter()

        def commit() -> None:
            self._weights = weights

        self._engines.rebuild(lambda sig: self._build(weights, sig), commit)
        self.info["refit_seconds"] = time.perf_counter() - start

    def close(self) -> None:
        self._engines.clear()
