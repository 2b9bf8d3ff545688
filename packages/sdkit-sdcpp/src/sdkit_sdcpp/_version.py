from __future__ import annotations

__version__ = "3.0.0.dev0"
