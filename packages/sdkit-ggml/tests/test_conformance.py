"""onnx.backend.test node cases through the ggml backend (about 30 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

from sdkit.testing import load_exclusions, run_conformance

EXCLUSIONS = Path(__file__).with_name("conformance_exclusions.txt")


def test_node_suite() -> None:
    result = run_conformance("ggml", exclusions=EXCLUSIONS)
    assert result.failed == {}, result.failed
    assert len(result.passed) >= 600, result.summary()


def test_every_exclusion_has_a_reason() -> None:
    pairs = load_exclusions(EXCLUSIONS)
    assert pairs
    assert all(reason for _, reason in pairs)
