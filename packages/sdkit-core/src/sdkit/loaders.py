"""Model loaders: the built-in single ``.onnx`` file loader (external data and an optional
``.safetensors`` weights override included), and the lookup ``load_model`` and
``load_pipeline`` share.

A loader (registered through ``sdkit_register_model_loaders``) has a ``name``, a ``priority``
(higher is asked first), a ``kind`` (``"model"``: returns a ``Model``; ``"pipeline"``: returns a
pipeline, and ``load_pipeline`` asks only these), a cheap ``sniff(path)`` and ``load(path, **kwargs)``.
A pipeline loader may also have ``explain(path) -> str``: why it does not take ``path``, which
``load_pipeline`` shows when no loader does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import OptionError
from sdkit.model import Model, load_onnx
from sdkit.plugins import get_plugins


def loaders_by_priority(kind: str | None = None) -> list[Any]:
    """An instance of each registered loader, highest priority first; only those of ``kind``
    (``"model"`` or ``"pipeline"``; a loader without a ``kind`` is a model loader) if given."""
    found = [cls() for _, cls in get_plugins().loaders.items()]
    if kind is not None:
        found = [loader for loader in found if getattr(loader, "kind", "model") == kind]
    return sorted(found, key=lambda loader: -getattr(loader, "priority", 0))


def find_loader(path: Path, kind: str | None = None) -> Any | None:
    """The first loader (of ``kind``, if given) whose ``sniff`` accepts ``path``, or None."""
    return next((loader for loader in loaders_by_priority(kind) if loader.sniff(path)), None)


class OnnxLoader:
    """``path.onnx`` -> Model."""

    name: ClassVar[str] = "onnx"
    priority: ClassVar[int] = 10
    kind: ClassVar[str] = "model"

    def sniff(self, path: Path) -> bool:
        return path.suffix.lower() == ".onnx"

    def load(self, path: Path, weights: str | os.PathLike[str] | None = None, **unknown: Any) -> Model:
        if unknown:
            raise OptionError(f"unknown load_model option(s) for an .onnx file: {', '.join(sorted(unknown))}")
        return load_onnx(path, weights=weights)
