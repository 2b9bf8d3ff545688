"""Where a pipeline component's ``Model`` comes from.

A component does not hold a path: it asks its *source* for a ``Model`` (a weightless ``Graph``
plus a ``WeightSet``) each time it compiles, which is at load under ``memory="keep"`` and at every
use under ``"offload"``. Today's source is an ``.onnx`` file of a diffusers folder. A single-file
checkpoint (issue 14) brings its own: the family's shipped weightless graph and a ``WeightSet``
mapped from the user's file, e.g.::

    @dataclass(frozen=True)
    class CheckpointSource:
        graph: Callable[[], Graph]            # the family's shipped graph, read on demand
        checkpoint: Path
        key_map: Mapping[str, str]            # graph initializer name -> checkpoint key
        def describe(self) -> str: return f"{self.checkpoint.name} (unet)"
        def load(self) -> Model: return Model(self.graph(), map_weights(self.checkpoint, self.key_map))

LoRA, embeddings and a VAE swap then change weights, not sources: ``Component.set_weights``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from sdkit.model import Model, load_onnx


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
        return load_onnx(self.path)


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
