"""Live previews for ``/sdapi/v1/progress``: a TAESD-class latent decoder run on the latents of the
step the job is at.

``--preview-decoder PATH.onnx`` names the decoder: one input, latents ``[1, C, h, w]`` in the
UNet's latent space (what TAESD/TAESDXL decoders take), one output, ``[1, 3, H, W]`` pixels in
[0, 1]. It is compiled with ``sdkit.compile`` like any model, and runs only when a client asks for
progress, on a thread of its own: it never slows the generation. Without one, progress reports no
image (the full VAE would cost as much as a step).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import InputError

log = logging.getLogger("sdkit_serve")


class PreviewDecoder:
    def __init__(self, path: Path, backend: str = "auto", device: Any = None, **options: Any) -> None:
        import sdkit

        self.path = Path(path)
        self._compiled = sdkit.compile(self.path, backend=backend, device=device, **options)
        if len(self._compiled.inputs) != 1:
            names = [i.name for i in self._compiled.inputs]
            raise InputError(f"the preview decoder {self.path.name} must take one input (latents), not {names}")
        self._input = self._compiled.inputs[0]
        self._lock = threading.Lock()  # one decode at a time; several /progress pollers share the result
        self._cached: tuple[object, Any] | None = None

    def decode(self, latents: np.ndarray) -> Any:
        """The first image of a latent batch as an RGB PIL image."""
        from PIL import Image

        feed = np.ascontiguousarray(latents[:1], dtype=self._input.dtype)
        outputs = self._compiled.run({self._input.name: feed})
        pixels = np.asarray(next(iter(outputs.values())), dtype=np.float32)
        if pixels.ndim != 4 or pixels.shape[1] != 3:
            raise InputError(f"the preview decoder returned {list(pixels.shape)}; expected [1, 3, H, W]")
        image = np.round(np.clip(pixels[0].transpose(1, 2, 0), 0.0, 1.0) * 255).astype(np.uint8)
        return Image.fromarray(image)

    def preview(self, key: object, latents: np.ndarray) -> Any | None:
        """``decode`` once per ``key`` (job and step); None when the decoder cannot take these
        latents (a model whose latent channels differ): logged, rather than failing progress."""
        with self._lock:
            if self._cached is not None and self._cached[0] == key:
                return self._cached[1]
            try:
                image = self.decode(latents)
            except Exception as exc:  # a preview is best-effort: progress must answer regardless
                log.warning("preview decoder %s failed on latents %s: %s", self.path.name, list(latents.shape), exc)
                image = None
            self._cached = (key, image)
            return image
