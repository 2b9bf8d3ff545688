from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

if importlib.util.find_spec("openvino") is None:  # the whole suite needs the runtime
    collect_ignore_glob = ["test_*.py"]
