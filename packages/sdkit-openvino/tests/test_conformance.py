"""onnx.backend.test node cases through sdkit-openvino (about a minute on 2 cores)."""

from __future__ import annotations

import warnings
from pathlib import Path

from sdkit.testing import run_conformance

EXCLUSIONS = Path(__file__).with_name("conformance_exclusions.txt")
MIN_PASSED = 1450  # 1,482 with OpenVINO 2026.4 and onnx 1.23


def test_node_conformance(sdkit_isolated: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the onnx case generators warn about inf/nan on purpose
        result = run_conformance("openvino", exclusions=EXCLUSIONS, cache=False)
    assert result.failed == {}, result.summary()
    assert len(result.passed) >= MIN_PASSED, result.summary()
