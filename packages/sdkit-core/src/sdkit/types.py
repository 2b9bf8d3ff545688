"""Value types shared by the model and the backend contract, with no sdkit imports of their own.

``Dim`` and ``TensorInfo`` describe graph inputs and outputs. ``sdkit.model`` builds them from ONNX
value infos and ``sdkit.backend`` checks feeds against them, so they live below both (public
names: ``sdkit.TensorInfo``, ``sdkit.backend.TensorInfo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, numpy dtype and shape (ints, symbolic names or None).

    ``kind`` is ``"tensor"`` for ordinary tensors; ``"sequence"``, ``"optional"`` or ``"map"``
    for the other ONNX value types (their dtype and shape are not checked)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[Dim, ...]
    kind: str = "tensor"

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"
