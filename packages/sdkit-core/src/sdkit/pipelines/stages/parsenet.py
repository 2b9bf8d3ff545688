"""ParseNet face parsing: the class map facexlib's ``FaceRestoreHelper.paste_faces_to_input_image``
computes for its ``use_parse=True`` paste-back mask.

    parser = ParseNetParser("parsing_parsenet.safetensors")
    classes = parser.parse(face)        # (512, 512) class indices of a (512, 512, 3) RGB face in [0, 1]

The file's weights fill the shipped weightless graph (``sdkit.families.parsenet``), compiled on any
backend. The face goes in as facexlib normalizes it (``(x - 0.5) / 0.5``, RGB, float32); the map is
the argmax over the 19 class logits (the first of equal maxima, as torch's ``argmax``). facexlib
reads a BGR uint8 restored face (``/ 255.``, then RGB): the caller gives that face as RGB floats.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.parsenet import ParseNetConfig, ParseNetFile, find_graph
from sdkit.limits import check_bytes
from sdkit.pipelines.stages.shipped_net import ShippedNetwork, compile_network

F32 = NDArray[np.float32]


class ParseNetParser(ShippedNetwork[ParseNetConfig]):
    """A ParseNet file compiled on a backend (module docstring)."""

    size = 512

    def __init__(
        self,
        path: str | os.PathLike[str],
        backend: str = "auto",
        device: str | None = None,
        *,
        graphs: Iterable[str | os.PathLike[str]] = (),
        **options: Any,
    ) -> None:
        with closing(ParseNetFile(path)) as file:
            model = self.fill(file, find_graph, graphs, path)
        self.compiled = compile_network(model, "face parser", backend, device, options)

    def logits(self, face: F32) -> F32:
        """The class logits [classes, H, W] of an (H, W, 3) RGB face in [0, 1]; H and W multiples
        of 16 (the network's four halvings), at least 32."""
        if not np.issubdtype(np.asarray(face).dtype, np.floating):
            raise InputError(f"face parsing takes RGB floats in [0, 1], got {np.asarray(face).dtype} values")
        x = np.asarray(face, dtype=np.float32)
        step = self.config.multiple_of
        if x.ndim != 3 or x.shape[2] != 3 or x.shape[0] % step or x.shape[1] % step or min(x.shape[:2]) < 2 * step:
            raise InputError(f"face parsing takes an (H, W, 3) RGB face, H and W multiples of {step}, got {x.shape}")
        if not np.isfinite(x).all():
            raise InputError("face parsing: the face has NaN or infinite values")
        check_bytes(x.shape[0] * x.shape[1] * (self.config.classes + 3) * 4 * 2, "face parsing")
        normalized = (x - np.float32(0.5)) / np.float32(0.5)
        out = self.compiled.run({"face": np.ascontiguousarray(normalized.transpose(2, 0, 1)[None])})
        logits: F32 = np.asarray(out["parsing"], dtype=np.float32)[0]
        return logits

    def parse(self, face: F32) -> NDArray[np.int64]:
        """(512, 512) class map of a (512, 512, 3) RGB face in [0, 1]: the argmax of facexlib's
        ParseNet output on its normalized input."""
        shape = np.shape(face)
        if tuple(shape) != (self.size, self.size, 3):
            raise InputError(f"face parsing takes a ({self.size}, {self.size}, 3) face, got {tuple(shape)}")
        return np.asarray(self.logits(face).argmax(axis=0), dtype=np.int64)
