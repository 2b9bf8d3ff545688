"""sdkit-coreml: Apple devices through Core ML. The probe is real; the compiler is not built yet."""

from __future__ import annotations

from sdkit_coreml._version import __version__

__all__ = ["__version__"]
