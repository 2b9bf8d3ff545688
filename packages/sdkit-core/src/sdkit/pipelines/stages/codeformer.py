"""CodeFormer face restoration on sdkit's backends.

    restorer = CodeFormerRestorer("codeformer-v0.1.0.safetensors")       # detected: 512 px
    restored = restorer.restore(face, fidelity=0.5)                       # (512, 512, 3) in [0, 1]

The file's configuration is read from its keys and shapes (``sdkit.families.codeformer``), its
weights fill the shipped weightless graph, and any backend compiles it. ``restore`` does what
A1111's CodeFormer restorer does to an aligned crop: RGB in [0, 1] normalised to [-1, 1]
(``normalize(mean=0.5, std=0.5)``), ``CodeFormer.forward(x, weight=w, adain=True)[0]``, the
result clamped to [-1, 1] and mapped back to [0, 1] (``tensor2img(min_max=(-1, 1))``, before
its rounding to 8 bits). The fidelity weight ``w`` runs from 0 (the codebook's face, maximum
effect) to 1 (closest to the input); None is A1111's default ``code_former_weight``, 0.5.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from contextlib import closing
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.codeformer import CodeFormerConfig, CodeFormerFile, find_graph
from sdkit.pipelines.stages.execution import check_finite
from sdkit.pipelines.stages.shipped_net import ShippedNetwork, compile_network

F32 = NDArray[np.float32]
DEFAULT_FIDELITY = 0.5  # A1111's code_former_weight


def fidelity_value(fidelity: float | None) -> float:
    """The fidelity weight as a float in [0, 1] (None: 0.5), an InputError otherwise."""
    if fidelity is None:
        return DEFAULT_FIDELITY
    if isinstance(fidelity, bool) or not isinstance(fidelity, (int, float, np.integer, np.floating)):
        raise InputError(f"CodeFormer fidelity must be a number in [0, 1], got {fidelity!r}")
    value = float(fidelity)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InputError(f"CodeFormer fidelity must be in [0, 1], got {value}")
    return value


class CodeFormerRestorer(ShippedNetwork[CodeFormerConfig]):
    """A CodeFormer file compiled on a backend, restoring aligned face crops."""

    name = "CodeFormer"
    takes_fidelity = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        backend: str = "auto",
        device: str | None = None,
        *,
        graphs: Iterable[str | os.PathLike[str]] = (),
        **options: Any,
    ) -> None:
        with closing(CodeFormerFile(path)) as file:
            model = self.fill(file, find_graph, graphs, path)
        self.size = self.config.size
        self.compiled = compile_network(model, "codeformer", backend, device, options)

    def _checked_face(self, face: Any) -> F32:
        array = np.asarray(face)
        if array.shape != (self.size, self.size, 3) or array.dtype.kind not in "fiu":
            raise InputError(
                f"CodeFormer takes a ({self.size}, {self.size}, 3) RGB face in [0, 1], "
                f"got {array.dtype} {list(array.shape)}"
            )
        pixels = np.asarray(array, dtype=np.float32)
        if not bool(np.isfinite(pixels).all()):
            raise InputError("CodeFormer face holds NaN or infinity")
        low, high = float(pixels.min()), float(pixels.max())
        if low < 0.0 or high > 1.0:
            raise InputError(f"CodeFormer face values must be in [0, 1], got [{low:g}, {high:g}]")
        return pixels

    def raw(self, face: F32, fidelity: float | None = None) -> F32:
        """The network's output for ``face`` (checked as in ``restore``): [1, 3, size, size],
        unclamped, in the network's [-1, 1] scale."""
        pixels = self._checked_face(face)
        w = fidelity_value(fidelity)
        image = np.ascontiguousarray(pixels.transpose(2, 0, 1)[None] * np.float32(2.0) - np.float32(1.0))
        out = self.compiled.run({"image": image, "w": np.array([w], dtype=np.float32)})["restored"]
        result = np.asarray(out, dtype=np.float32)
        check_finite(result, "the CodeFormer face restorer", "check the CodeFormer file's weights")
        return result

    def restore(self, face: F32, fidelity: float | None = None) -> F32:
        """``face``: (size, size, 3) RGB in [0, 1] (the aligned crop). Returns the restored face,
        same shape, in [0, 1]; ``fidelity`` w in [0, 1] (None: 0.5). Faces or weights out of
        range, or not finite, are an InputError."""
        out = self.raw(face, fidelity)[0]
        restored = (np.clip(out, -1.0, 1.0) + np.float32(1.0)) * np.float32(0.5)
        return np.ascontiguousarray(restored.transpose(1, 2, 0), dtype=np.float32)
