"""GFPGAN face restoration (v1.2 - v1.4) on any backend.

    restorer = GFPGANRestorer("GFPGANv1.4.safetensors")     # detected: 512 px, style width 512
    restored = restorer.restore(face)                         # (512, 512, 3) RGB in [0, 1]

The file's configuration comes from its keys and shapes (``sdkit.families.gfpgan``), its weights
fill the shipped weightless graph, and any backend compiles it. ``restore`` does what gfpgan's
``GFPGANer`` and A1111's ``face_restoration_utils`` do around the network: the aligned crop,
RGB in [0, 1], normalised to [-1, 1] (mean 0.5, std 0.5), the network's first output clamped to
[-1, 1] and mapped back to [0, 1].

The StyleGAN2 decoder adds noise maps to its features. gfpgan and A1111 call the network with
``randomize_noise=True``: fresh N(0, 1) noise from torch's global generator on every call (so
they do not repeat themselves). Here ``noise="random"`` (the default) draws the same
distribution from numpy's generator seeded with ``seed`` on every call: the same face gives the
same result. ``noise="stored"`` uses the file's ``stylegan_decoder.noises.noise<i>`` buffers,
as basicsr's ``randomize_noise=False`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.gfpgan import GFPGANConfig, GFPGANFile, find_graph
from sdkit.pipelines.stages.shipped_net import ShippedNetwork, compile_network

F32 = NDArray[np.float32]
NOISE_MODES = ("random", "stored")


class GFPGANRestorer(ShippedNetwork[GFPGANConfig]):
    """A GFPGAN file compiled on a backend, restoring aligned face crops."""

    name = "GFPGAN"  # A1111's label
    takes_fidelity = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        backend: str = "auto",
        device: str | None = None,
        *,
        noise: str = "random",
        seed: int = 0,
        graphs: Iterable[str | os.PathLike[str]] = (),
        **options: Any,
    ) -> None:
        if noise not in NOISE_MODES:
            raise InputError(f"GFPGAN noise must be one of {', '.join(NOISE_MODES)}; got {noise!r}")
        with closing(GFPGANFile(path)) as file:
            model = self.fill(file, find_graph, graphs, path)
            self._stored = file.stored_noise() if noise == "stored" else None
        self.noise, self.seed = noise, int(seed)
        self.compiled = compile_network(model, "gfpgan", backend, device, options)

    @property
    def size(self) -> int:
        """The face crop's side the network takes (512 for v1.4)."""
        return self.config.size

    def noise_maps(self) -> list[F32]:
        """The decoder's noise maps for one call (module docstring)."""
        if self._stored is not None:
            return self._stored
        rng = np.random.default_rng(self.seed)
        return [rng.standard_normal(shape, dtype=np.float32) for shape in self.config.noise_shapes()]

    def restore(self, face: F32, fidelity: float | None = None) -> F32:
        """``face``: ``(size, size, 3)`` RGB in [0, 1] (the aligned crop). Returns the restored
        face, same shape, clamped to [0, 1]. ``fidelity`` must be None (GFPGAN has no such weight)."""
        if fidelity is not None:
            raise InputError("GFPGAN has no fidelity weight (CodeFormer has one): pass fidelity=None")
        x = np.asarray(face, dtype=np.float32)
        side = self.size
        if x.shape != (side, side, 3):
            raise InputError(f"GFPGAN takes a ({side}, {side}, 3) RGB face crop, got {list(x.shape)}")
        if not np.isfinite(x).all():
            raise InputError("GFPGAN face crop has NaN or infinite values")
        feeds = {"image": np.ascontiguousarray(x.transpose(2, 0, 1)[None] * 2 - 1)}
        feeds.update({f"noise{i}": n for i, n in enumerate(self.noise_maps())})
        out = np.asarray(self.compiled.run(feeds)["restored"], dtype=np.float32)[0]
        restored: F32 = np.ascontiguousarray(((np.clip(out, -1.0, 1.0) + 1) / 2).transpose(1, 2, 0), dtype=np.float32)
        return restored
