"""sdkit-migraphx: AMD GPUs through ROCm's MIGraphX.

Importing this package does not import ``migraphx``; the backend loads it on first use.
"""

from __future__ import annotations

from sdkit_migraphx._version import __version__
from sdkit_migraphx.backend import MigraphxBackend

__all__ = ["MigraphxBackend", "__version__"]
