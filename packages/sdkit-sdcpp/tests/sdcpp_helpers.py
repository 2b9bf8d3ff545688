"""Test helpers of sdkit-sdcpp: whether the binding is here. GGUF test files come from
``sdkit.testing.gguf_files`` (shared with sdkit-core's tests)."""

from __future__ import annotations

import importlib.util

import pytest

HAVE_BINDING = importlib.util.find_spec("stable_diffusion_cpp") is not None
needs_binding = pytest.mark.skipif(
    not HAVE_BINDING, reason="stable-diffusion-cpp-python is not installed (python3 dev.py sdcpp builds it)"
)
