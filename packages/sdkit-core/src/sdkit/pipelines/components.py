"""Pipeline components: one ONNX model each, compiled with ``sdkit.compile`` for the backend and
device chosen for that component, under a memory policy.

- ``keep``: each component is compiled the first time it runs and stays resident.
- ``offload``: each use loads the model from disk, compiles it, runs it and releases it (weights,
  graph and compiled engine), so only one component is in memory at a time. Slower (a compile per
  use; backends with an artifact cache make it cheaper), lower peak memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from sdkit.backend import CompiledModel, TensorInfo
from sdkit.device import Device
from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.model import Model, load_onnx
from sdkit.pipelines.pruning import keep_outputs

T = TypeVar("T")
MemoryPolicy = Literal["keep", "offload"]
MEMORY_POLICIES: tuple[str, ...] = ("keep", "offload")
COMPONENT_NAMES: tuple[str, ...] = ("text_encoder", "unet", "vae_decoder", "vae_encoder")
PerComponent = str | Device | None | Mapping[str, Any]


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
    path: Path
    backend: str = "auto"
    device: str | Device | None = None
    options: Mapping[str, Any] | None = None
    policy: MemoryPolicy = "keep"
    outputs: tuple[str, ...] = ()  # the outputs the pipeline reads; others are pruned away

    def __post_init__(self) -> None:
        if self.policy not in MEMORY_POLICIES:
            raise OptionError(f"unknown memory policy {self.policy!r}; choose one of {', '.join(MEMORY_POLICIES)}")
        self._compiled: CompiledModel | None = None
        self._backend_name: str | None = None

    def _load(self) -> Model:
        try:
            model = load_onnx(self.path)
        except ModelFormatError as exc:
            raise self._unreadable(exc) from None
        return keep_outputs(model, self.outputs) if self.outputs else model

    def _unreadable(self, exc: ModelFormatError) -> ModelFormatError:
        """``unet/model.onnx in FOLDER is not a readable ONNX model: ...``: the loader's message
        names only ``model.onnx``, which every component of a pipeline is called."""
        where = f"{self.path.parent.name}/{self.path.name} in {self.path.parent.parent}"
        detail = str(exc)
        prefix = f"{self.path.name} "
        detail = detail[len(prefix) :] if detail.startswith(prefix) else f"cannot be loaded: {detail}"
        return ModelFormatError(f"{where} {detail} (the pipeline's {self.name}); export or download it again")

    def _compile(self, model: Model) -> CompiledModel:
        from sdkit.api import compile as compile_model

        compiled = compile_model(model, backend=self.backend, device=self.device, **dict(self.options or {}))
        self._backend_name = compiled.backend_name or str(self.backend)
        return compiled

    @property
    def backend_name(self) -> str | None:
        """The backend that compiled this component last (None before its first run)."""
        return self._backend_name

    def prepare(self) -> None:
        """Compile now (``keep``), instead of on first use."""
        if self.policy == "keep" and self._compiled is None:
            self._compiled = self._compile(self._load())

    def use(self, work: Callable[[CompiledModel], T]) -> T:
        """``work(compiled)`` for one or more runs; under ``offload`` the model is compiled for
        it and released afterwards. ``work`` must not keep the compiled model: this method holds
        the only reference, so the memory is really freed when it returns."""
        if self.policy == "keep":
            self.prepare()
            assert self._compiled is not None
            return work(self._compiled)
        model = self._load()
        compiled = self._compile(model)
        del model
        try:
            return work(compiled)
        finally:
            compiled.close()
            del compiled
            return_memory_to_os()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.use(lambda compiled: compiled.run(feeds))

    def release(self) -> None:
        if self._compiled is not None:
            self._compiled.close()
            self._compiled = None
            return_memory_to_os()


def output_named(outputs: Mapping[str, np.ndarray], preferred: tuple[str, ...], component: str) -> np.ndarray:
    """The first of ``preferred`` present in ``outputs``, else the only/first output."""
    for name in preferred:
        if name in outputs:
            return outputs[name]
    if not outputs:
        raise InputError(f"the {component} model returned no outputs")
    return next(iter(outputs.values()))


def input_info(compiled: CompiledModel, name: str) -> TensorInfo | None:
    """The compiled model's input called ``name``, if it has one."""
    return next((i for i in compiled.inputs if i.name == name), None)
