"""sdkit-coreml: Apple devices through Core ML, translating ONNX to an ML program with
coremltools' MIL builder.

Importing this package does not import coremltools; the backend loads it on first use.
"""

from __future__ import annotations

from sdkit_coreml._version import __version__
from sdkit_coreml.backend import CoremlBackend
from sdkit_coreml.export import export_mlpackage

__all__ = ["CoremlBackend", "__version__", "export_mlpackage"]
