"""Built-in model loaders: a single ``.onnx`` file (external data and an optional
``.safetensors`` weights override included)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from sdkit.errors import OptionError
from sdkit.model import Model, load_onnx


class OnnxLoader:
    """``path.onnx`` -> Model."""

    name: ClassVar[str] = "onnx"
    priority: ClassVar[int] = 10

    def sniff(self, path: Path) -> bool:
        return path.suffix.lower() == ".onnx"

    def load(self, path: Path, weights: str | os.PathLike[str] | None = None, **unknown: Any) -> Model:
        if unknown:
            raise OptionError(f"unknown load_model option(s) for an .onnx file: {', '.join(sorted(unknown))}")
        return load_onnx(path, weights=weights)
