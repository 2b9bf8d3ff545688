"""sdkit-sdcpp: whole pipelines on stable-diffusion.cpp (``.gguf`` and quantized files, and single
files with ``backend="sdcpp"``), through its binding stable-diffusion-cpp-python.

Import-light: the binding (and its native library) loads only when a pipeline loads or the engine
is probed.
"""

from __future__ import annotations

from sdkit_sdcpp._version import __version__

__all__ = ["__version__"]
