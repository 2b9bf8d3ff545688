"""Test helpers for plugin authors: the ONNX conformance adapter and pytest fixtures.

    from sdkit.testing import onnx_backend, run_conformance
    result = run_conformance("mybackend", exclusions="tests/conformance_exclusions.txt")
    assert result.failed == [] and result.passed >= 600

The fixtures (``sdkit_isolated``, ``one_node_model``, ``assert_like_reference``) are
registered with pytest automatically when sdkit-core is installed.
"""

from __future__ import annotations

from sdkit.testing.adapter import (
    ConformanceResult,
    load_exclusions,
    onnx_backend,
    run_conformance,
)
from sdkit.testing.models import compare_with_reference, one_node_model
from sdkit.testing.safetensors_files import write_header_only_safetensors

__all__ = [
    "ConformanceResult",
    "compare_with_reference",
    "load_exclusions",
    "one_node_model",
    "onnx_backend",
    "run_conformance",
    "write_header_only_safetensors",
]
