"""What ``sdkit generate`` shows while it works, on stderr: one line per phase (loading the model,
compiling each component with the backend that compiled it, each component's first run) and a
step bar with it/s and ETA for sampling (the hires second pass counts on in the same bar) and the
tiles of a tiled VAE pass. On a terminal the bar redraws one line; into a pipe or a log file the
same facts come as plain lines (at most one every ``interval`` seconds, plus the first and last
step). ``--quiet`` shows nothing. Fed by the request's step ``callback`` and the pipeline's phase
events (``sdkit.pipelines.stages.phases``).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

import numpy as np

from sdkit.pipelines.stages.phases import listening

BAR_WIDTH = 24
# Every line this module writes into a pipe (tests set them apart from an error line).
PROGRESS_LINE = re.compile(
    r"(loading .* \.\.\.|loaded .* in \d+\.\d s|compiling \S+ \(backend .*\) \.\.\.|compiled \S+ with .* in \d+\.\d s"
    r"|running \S+ for the first time \.\.\.|first run of \S+: \d+\.\d s|(sampling|\S+ tiles) \d+/\d+ .* it/s, ETA .*)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines or bar on stderr")


def clock_text(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _Bar:
    """One counted task (``sampling``, ``vae tiles``): its rate from the updates after the first."""

    def __init__(self, label: str, total: int, now: float) -> None:
        self.label, self.total = label, total
        self.first_done, self.first_time = 0, now
        self.done = 0
        self.shown_at = -float("inf")

    def update(self, done: int, now: float) -> None:
        if self.done == 0:  # the first update sets the origin: it may include a compile or a first run
            self.first_done, self.first_time = done, now
        self.done = done

    def text(self, now: float, graphic: bool) -> str:
        count = f"{self.done}/{self.total}"
        if graphic:
            filled = BAR_WIDTH * self.done // max(self.total, 1)
            count = f"{count} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"
        elapsed = now - self.first_time
        if self.done > self.first_done and elapsed > 0:
            rate = (self.done - self.first_done) / elapsed
            timing = f"{rate:.2f} it/s, ETA {clock_text((self.total - self.done) / rate)}"
        else:
            timing = "? it/s, ETA ?"
        return f"{self.label} {count} {timing}"


class ProgressReport:
    """Progress on ``stream`` (default stderr): a bar where it is a terminal, else plain lines."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        quiet: bool = False,
        interval: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.quiet = quiet
        self.graphic = not quiet and _isatty(self.stream)
        self.interval = interval
        self.clock = clock
        self._bar: _Bar | None = None
        self._drawn = 0  # characters of the bar on the terminal's current line

    @classmethod
    def for_args(cls, args: argparse.Namespace) -> ProgressReport:
        return cls(quiet=bool(getattr(args, "quiet", False)))

    @property
    def callback(self) -> Callable[[int, int, np.ndarray], None] | None:
        """The request's step callback (None under ``--quiet``: the loop then calls nothing)."""
        return None if self.quiet else self.step

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Report the phase events of the work done inside the block."""
        with listening(None if self.quiet else self.on_phase):
            try:
                yield
            finally:
                self.close()

    def line(self, text: str) -> None:
        """One phase line (a bar being drawn is cleared first and redrawn at its next update)."""
        if self.quiet:
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, index: int, total: int, latents: np.ndarray) -> None:
        self._count("sampling", index + 1, total)

    def on_phase(self, event: str, component: str, details: Mapping[str, Any]) -> None:
        seconds = details.get("seconds", 0.0)
        if event == "compile":
            self.line(f"compiling {component} (backend {details.get('backend', 'auto')}) ...")
        elif event == "compiled":
            self.line(f"compiled {component} with {details.get('backend')} in {seconds:.1f} s")
        elif event == "first run":
            self.line(f"running {component} for the first time ...")
        elif event == "first ran":
            self.line(f"first run of {component}: {seconds:.1f} s")
        elif event == "tile":
            self._count(f"{component} tiles", int(details["index"]), int(details["total"]))

    def _count(self, label: str, done: int, total: int) -> None:
        now = self.clock()
        bar = self._bar
        if bar is None or bar.label != label or bar.total != total or done <= bar.done:
            self._finish()
            bar = self._bar = _Bar(label, total, now)
        bar.update(done, now)
        last = done >= total
        if self.graphic:
            text = bar.text(now, graphic=True)
            self.stream.write("\r" + text.ljust(self._drawn))
            self._drawn = len(text)
        elif last or done == 1 or now - bar.shown_at >= self.interval:
            self.stream.write(bar.text(now, graphic=False) + "\n")
            bar.shown_at = now
        self.stream.flush()
        if last:
            self._finish()

    def _finish(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self._drawn = 0
        self._bar = None

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def close(self) -> None:
        if not self.quiet:
            self._finish()
            self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream: plain lines
        return False
