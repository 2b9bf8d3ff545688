"""sdkit-ggml: ONNX graphs compiled to ggml, run on any ggml backend (CPU, CUDA, Vulkan, Metal).

Import-light: the ggml libraries load only when the backend is probed or used.
"""

from __future__ import annotations

from sdkit_ggml._version import __version__

__all__ = ["__version__"]
