"""sdkit-migraphx: AMD GPUs through MIGraphX. The probe is real; the compiler is not built yet."""

from __future__ import annotations

from sdkit_migraphx._version import __version__

__all__ = ["__version__"]
