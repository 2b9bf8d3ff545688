"""sdkit-openvino: the OpenVINO backend for sdkit (CPU, Intel GPU, NPU).

Importing this package does not import OpenVINO; the backend loads it on first use.
"""

from __future__ import annotations

from sdkit_openvino._version import __version__
from sdkit_openvino.backend import OpenVinoBackend

__all__ = ["OpenVinoBackend", "__version__"]
