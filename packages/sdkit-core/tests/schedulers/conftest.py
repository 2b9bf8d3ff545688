"""The scheduler tests' shared helpers live in ``scheduler_goldens`` (importable under importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # ``import scheduler_goldens`` under importlib mode
