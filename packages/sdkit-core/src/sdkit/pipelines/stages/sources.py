"""Where a pipeline component's ``Model`` comes from.

A component does not hold a path: it asks its *source* for a ``Model`` (a weightless ``Graph``
plus a ``WeightSet``) each time it compiles, which is at load under ``memory="keep"`` and at every
use under ``"offload"``. A diffusers/optimum ONNX folder's source is an ``.onnx`` file
(``OnnxFileSource``); a single-file checkpoint's (issue 14) is the family's shipped weightless
graph plus the ``WeightSet`` mapped from the user's file, whose tensors are read from the file
when the backend asks for them (``GraphWithWeights``, made by ``sdkit.pipelines.loaders.families``).

LoRA, embeddings and a VAE swap change weights, not sources: ``Component.set_weights`` with fresh
arrays for the names they change. Another checkpoint of the same family is another source:
``Component.set_source`` (``Pipeline.set_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from sdkit.errors import ModelFormatError
from sdkit.model import Graph, Model, WeightSet, load_onnx


@runtime_checkable
class ModelSource(Protocol):
    """Provides a component's Model; called once per compile, so it may read lazily."""

    def describe(self) -> str:
        """A short name for messages, e.g. ``unet/model.onnx``."""
        ...

    def load(self) -> Model:
        """The Model (graph + weights); ``ModelFormatError`` when it cannot be read."""
        ...


@dataclass(frozen=True)
class OnnxFileSource:
    """An ``.onnx`` file (external data included), as in a diffusers/optimum ONNX folder."""

    path: Path

    def describe(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    def load(self) -> Model:
        try:
            return load_onnx(self.path)
        except ModelFormatError as exc:
            raise self._unreadable(exc) from None

    def _unreadable(self, exc: ModelFormatError) -> ModelFormatError:
        """``unet/model.onnx in FOLDER is not a readable ONNX model: ...``: the loader's message
        names only ``model.onnx``, which every component of a pipeline is called."""
        where = f"{self.describe()} in {self.path.parent.parent}"
        detail = str(exc)
        prefix = f"{self.path.name} "
        detail = detail[len(prefix) :] if detail.startswith(prefix) else f"cannot be loaded: {detail}"
        return ModelFormatError(
            f"{where} {detail} (the pipeline's {self.path.parent.name}); export or download it again"
        )


@dataclass(frozen=True, eq=False)
class ModelInMemory:
    """A Model that is already loaded (tests, or a model built in code). It stays in memory
    whatever the component's memory policy."""

    model: Model
    name: str = "model"

    def describe(self) -> str:
        return self.name

    def load(self) -> Model:
        return self.model


@dataclass(frozen=True, eq=False)
class GraphWithWeights:
    """A weightless graph (read on demand, e.g. a family's shipped one) and a ``WeightSet`` for
    it (e.g. lazily mapped from a checkpoint). ``weights`` is the component's base: LoRA merges
    read it and hand their changed arrays to ``Component.set_weights``."""

    graph: Callable[[], Graph]
    weights: WeightSet
    name: str = "model"

    def describe(self) -> str:
        return self.name

    def load(self) -> Model:
        return Model(self.graph(), self.weights)
