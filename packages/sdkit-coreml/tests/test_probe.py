from __future__ import annotations

import sys

import pytest

from sdkit.errors import BackendUnavailableError
from sdkit_coreml.backend import CoremlBackend, apple_devices


def test_probe_says_why_and_what_to_install() -> None:
    availability = CoremlBackend().probe()
    assert not availability.ok
    if sys.platform != "darwin":
        assert "macOS" in availability.reason
        assert "sdkit[apple]" in availability.install_hint
        assert CoremlBackend().devices() == []


def test_compile_refuses_instead_of_faking() -> None:
    with pytest.raises(BackendUnavailableError):
        CoremlBackend().compile(None, None, None, None)  # type: ignore[arg-type]


def test_compute_units() -> None:
    assert [str(d) for d in apple_devices("arm64")] == ["ane", "gpu:0", "cpu"]
    assert [str(d) for d in apple_devices("x86_64")] == ["cpu"]
