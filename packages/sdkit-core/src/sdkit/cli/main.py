"""Entry point of the ``sdkit`` console script (commands are filled in below)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("sdkit: CLI under construction", file=sys.stderr)
    return 1
