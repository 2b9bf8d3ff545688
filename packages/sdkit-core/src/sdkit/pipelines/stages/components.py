"""Pipeline components: one model each, taken from a ``ModelSource`` and compiled with
``sdkit.compile`` for the backend and device chosen for that component, under a memory policy.

- ``keep``: each component is compiled the first time it runs and stays resident.
- ``offload``: each use loads the model from its source, compiles it, runs it and releases it
  (weights, graph and compiled engine), so only one component is in memory at a time. Slower (a
  compile per use; backends with an artifact cache make it cheaper), lower peak memory.

Weights can be swapped without a new source (a LoRA merge, a VAE swap): ``set_weights`` refits the
compiled model where the backend can, else the next use compiles with the new weights.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import numpy as np

from sdkit.api import compile as compile_model
from sdkit.backend import CompiledModel
from sdkit.device import Device
from sdkit.errors import OptionError
from sdkit.families.checkpoint import normalize_prediction
from sdkit.model import Model
from sdkit.pipelines.stages.phases import report
from sdkit.pipelines.stages.pruning import keep_outputs
from sdkit.pipelines.stages.sources import ModelSource

T = TypeVar("T")
MemoryPolicy = Literal["keep", "offload"]
MEMORY_POLICIES: tuple[str, ...] = ("keep", "offload")
PerComponent = str | Device | None | Mapping[str, Any]
WeightSwap = Literal["refit", "recompile"]
# load_pipeline options naming a component's own file (stable-diffusion.cpp's --clip_l, --t5xxl, --vae).
# The last four only stable-diffusion.cpp takes (sdkit-sdcpp): --llm, --clip_vision,
# --high-noise-diffusion-model, --photo-maker; core's families refuse them by name.
COMPONENT_FILES = (
    "clip_l",
    "clip_g",
    "t5xxl",
    "vae",
    "llm",
    "clip_vision",
    "high_noise_diffusion_model",
    "photo_maker",
)


def per_component(value: PerComponent, components: tuple[str, ...], what: str, default: Any) -> dict[str, Any]:
    """``"ggml"`` for all components, or ``{"unet": "ggml", "default": "auto"}`` per component
    (``"default"`` or ``"*"`` fills the ones not named)."""
    if not isinstance(value, Mapping):
        return dict.fromkeys(components, default if value is None else value)
    unknown = [k for k in value if k not in (*components, "default", "*")]
    if unknown:
        raise OptionError(f"unknown pipeline component {unknown[0]!r} in {what}; components: {', '.join(components)}")
    fallback = value.get("default", value.get("*", default))
    return {c: value.get(c, fallback) for c in components}


def return_memory_to_os() -> None:
    """Collect garbage, then ask glibc to give freed heap pages back. Without the trim, the
    hundreds of MB a released component freed stay in the process (glibc keeps them for reuse),
    and ``offload`` would not lower resident memory between stages. A no-op elsewhere."""
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # musl and others have no malloc_trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class Component:
    """One model of the pipeline, compiled on demand for its backend and device."""

    name: str
    source: ModelSource
    backend: str = "auto"
    device: str | Device | None = None
    options: Mapping[str, Any] | None = None
    policy: MemoryPolicy = "keep"
    outputs: tuple[str, ...] = ()  # the outputs the pipeline reads; others are pruned away
    _compiled: CompiledModel | None = field(default=None, init=False, repr=False)
    _backend_name: str | None = field(default=None, init=False, repr=False)
    _weights: Mapping[str, np.ndarray] | None = field(default=None, init=False, repr=False)
    _graph_hash: str | None = field(default=None, init=False, repr=False)  # of the compiled graph
    _ran: bool = field(default=False, init=False, repr=False)  # a first use happened (phase events)
    # a graph change applied before pruning (clip skip's extra output), its key, and the outputs
    # the component kept before one was set
    _edit: Callable[[Model], Model] | None = field(default=None, init=False, repr=False)
    _edit_key: str | None = field(default=None, init=False, repr=False)
    _base_outputs: tuple[str, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in MEMORY_POLICIES:
            raise OptionError(f"unknown memory policy {self.policy!r}; choose one of {', '.join(MEMORY_POLICIES)}")

    def load_model(self) -> Model:
        """The model this component compiles: the source's, with ``set_weights`` applied and the
        outputs the pipeline never reads pruned."""
        model = self.source.load()
        if self._weights is not None:
            model = model.with_weights(self._weights)
        if self._edit is not None:
            model = self._edit(model)
        return keep_outputs(model, self.outputs) if self.outputs else model

    def _compile(self, model: Model) -> CompiledModel:
        report("compile", self.name, backend=str(self.backend))
        start = time.perf_counter()
        compiled = compile_model(model, backend=self.backend, device=self.device, **dict(self.options or {}))
        self._backend_name = compiled.backend_name or str(self.backend)
        self._graph_hash = model.graph.hash
        report("compiled", self.name, backend=self._backend_name, seconds=time.perf_counter() - start)
        return compiled

    def _first(self, work: Callable[[CompiledModel], T], compiled: CompiledModel) -> T:
        """``work(compiled)``; on the component's first use, its first ``run`` sends phase events."""
        if self._ran:
            return work(compiled)
        self._ran = True
        return work(cast("CompiledModel", _FirstRun(compiled, self.name)))

    @property
    def backend_name(self) -> str | None:
        """The backend that compiled this component last (None before its first run). Under
        ``tune=True`` that is known once a run has measured or looked up the timings."""
        if self._compiled is not None and self._compiled.backend_name:
            return self._compiled.backend_name
        return self._backend_name

    @property
    def compiled(self) -> CompiledModel | None:
        """The resident compiled model (``keep`` after the first use), else None."""
        return self._compiled

    def prepare(self) -> None:
        """Compile now (``keep``), instead of on first use."""
        if self.policy == "keep" and self._compiled is None:
            self._compiled = self._compile(self.load_model())

    def use(self, work: Callable[[CompiledModel], T]) -> T:
        """``work(compiled)`` for one or more runs; under ``offload`` the model is compiled for
        it and released afterwards. ``work`` must not keep the compiled model: this method holds
        the only reference, so the memory is really freed when it returns."""
        if self.policy == "keep":
            self.prepare()
            assert self._compiled is not None
            return self._first(work, self._compiled)
        model = self.load_model()
        compiled = self._compile(model)
        del model
        try:
            return self._first(work, compiled)
        finally:
            self._backend_name = compiled.backend_name or self._backend_name  # tune=True: known after a run
            compiled.close()
            del compiled
            return_memory_to_os()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.use(lambda compiled: compiled.run(feeds))

    def set_weights(self, weights: Mapping[str, np.ndarray] | None) -> WeightSwap:
        """Replace some or all of the source's weights (checked by name, shape and dtype when
        the model is next loaded); ``None`` returns to the source's own.

        A resident compiled model is refit in place where its backend can (``"refit"``); where
        it cannot, it is released and the next use compiles with the new weights
        (``"recompile"``, also the answer when nothing is compiled now). Callers hand a fresh
        mapping each time (a LoRA merge makes new arrays, never changes the base in place).
        """
        self._weights = weights
        if self._compiled is None:
            return "recompile"
        return self._refit(self.load_model())

    def _refit(self, model: Model) -> WeightSwap:
        assert self._compiled is not None
        try:
            self._compiled.refit(model.weights)
        except NotImplementedError:
            self.release()
            return "recompile"
        except BaseException:
            self.release()  # a half-refit engine must not run again
            raise
        return "refit"

    def set_source(self, source: ModelSource) -> WeightSwap:
        """Take the model from ``source`` from now on (another checkpoint of the same family).
        Weights given to ``set_weights`` are dropped: they were made for the old source's.

        A resident compiled model whose graph is the new source's is refit in place where its
        backend can (``"refit"``: the compiled artifact is reused); otherwise it is released and
        the next use compiles (``"recompile"``, also the answer when nothing is compiled now).
        """
        self.source = source
        self._weights = None
        if self._compiled is None:
            return "recompile"
        model = self.load_model()
        if model.graph.hash != self._graph_hash:
            self.release()
            return "recompile"
        return self._refit(model)

    def set_edit(
        self, key: str | None, edit: Callable[[Model], Model] | None, renamed: tuple[str, str] | None = None
    ) -> None:
        """Change the graph with ``edit`` before pruning from now on (None: the source's graph);
        ``renamed`` (old, new): the kept output ``old`` is replaced by ``new``. ``key`` names the
        change: a different one releases the compiled model (the next use compiles the new
        graph); the same one changes nothing."""
        if self._base_outputs is None:
            self._base_outputs = self.outputs
        if key == self._edit_key:
            return
        old, new = renamed or ("", "")
        self._edit, self._edit_key = edit, key
        self.outputs = tuple(new if name == old else name for name in self._base_outputs)
        self.release()

    def release(self) -> None:
        if self._compiled is not None:
            self._compiled.close()
            self._compiled = None
            return_memory_to_os()


class _FirstRun:
    """A compiled model whose first ``run`` is announced (``"first run"``, then ``"first ran"``
    with its seconds); everything else goes to the model itself."""

    def __init__(self, compiled: CompiledModel, name: str) -> None:
        self._compiled, self._name, self._done = compiled, name, False

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._done:
            return self._compiled.run(feeds)
        report("first run", self._name)
        start = time.perf_counter()
        outputs = self._compiled.run(feeds)
        self._done = True
        report("first ran", self._name, seconds=time.perf_counter() - start)
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


@dataclass(frozen=True)
class LoadSettings:
    """How a pipeline loads: backend and device (one for all, or per component), memory policy,
    compile options, and the prediction type (``"v"``, ``"epsilon"``) when the model's files do
    not say it. Checked once, by ``load_pipeline`` / the loader."""

    backend: str | Mapping[str, str] = "auto"
    device: str | Device | Mapping[str, str | Device | None] | None = None
    memory: str = "keep"
    options: Mapping[str, Any] = field(default_factory=dict)
    prediction: str | None = None  # what the model predicts when its files do not say (or to override them)
    # Components a checkpoint takes from their own files (a Flux transformer file's clip_l, t5xxl, vae).
    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_POLICIES:
            raise OptionError(f"unknown memory policy {self.memory!r}; choose one of {', '.join(MEMORY_POLICIES)}")
        object.__setattr__(self, "prediction", normalize_prediction(self.prediction))

    @classmethod
    def create(
        cls,
        backend: str | Mapping[str, str] = "auto",
        device: str | Device | Mapping[str, str | Device | None] | None = None,
        memory: str = "keep",
        prediction: str | None = None,
        **options: Any,
    ) -> LoadSettings:
        files = {name: str(path) for name in COMPONENT_FILES if (path := options.pop(name, None)) is not None}
        return cls(backend, device, memory, options, prediction, files)

    def components(
        self,
        names: tuple[str, ...],
        sources: Mapping[str, ModelSource],
        outputs: Mapping[str, tuple[str, ...]] | None = None,
        fp32: Collection[str] = (),
    ) -> dict[str, Component]:
        """A Component for each source. ``names`` are every component the pipeline may have
        (a backend, device or precision mapping may name only those); ``outputs`` the ones it
        reads; ``fp32`` the ones kept in fp32 (see ``component_options``)."""
        names = tuple(dict.fromkeys((*names, *sources)))
        backends = per_component(self.backend, names, "backend", "auto")
        devices = per_component(self.device, names, "device", None)
        options = self.component_options(names, fp32)
        reads = outputs or {}
        return {
            name: Component(
                name,
                source,
                backends[name],
                devices[name],
                options[name],
                cast("MemoryPolicy", self.memory),  # checked in __post_init__
                reads.get(name, ()),
            )
            for name, source in sources.items()
        }

    def component_options(self, names: tuple[str, ...], fp32: Collection[str] = ()) -> dict[str, dict[str, Any]]:
        """Each component's compile options. ``precision`` is one value for every component or a
        mapping per component (``{"unet": "fp16", "default": "fp16"}``); the ``fp32`` components
        (SDXL's VAE, ``PipelineConfig.fp32_components``) stay fp32 unless the mapping names them."""
        precision = self.options.get("precision")
        if isinstance(precision, Mapping):
            chosen = per_component(precision, names, "precision", None)
            named = set(precision)
        else:
            chosen, named = dict.fromkeys(names, precision), set()
        result = {}
        for name in names:
            options = {k: v for k, v in self.options.items() if k != "precision"}
            value = "fp32" if name in fp32 and name not in named and chosen[name] is not None else chosen[name]
            if value is not None:
                options["precision"] = value
            result[name] = options
        return result
