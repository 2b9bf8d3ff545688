"""Command output in tests: ``sdkit generate``'s progress lines on stderr
(``sdkit.cli.progress_report``) set apart, so a test reads the error line(s) alone."""

from __future__ import annotations

from sdkit.cli.progress_report import PROGRESS_LINE


def without_progress(err: str) -> str:
    """``err`` without the progress lines (every other line kept, a traceback's included)."""
    return "".join(line for line in err.splitlines(keepends=True) if not PROGRESS_LINE.fullmatch(line.rstrip("\n")))
