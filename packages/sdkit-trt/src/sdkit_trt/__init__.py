"""sdkit-trt: NVIDIA GPUs through TensorRT-RTX (preferred) or TensorRT 10/11."""

from __future__ import annotations

from sdkit_trt._version import __version__

__all__ = ["__version__"]
