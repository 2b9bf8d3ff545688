"""Fixtures of sdkit-trt's tests; helpers live in ``trt_helpers`` (importable by name)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # for ``import trt_helpers`` under importlib mode
