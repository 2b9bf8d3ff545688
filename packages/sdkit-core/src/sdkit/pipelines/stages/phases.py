"""Phase events: a light hook through which a pipeline tells a listener what it is doing now
(compiling a component, running it for the first time, decoding a tile), so a front end can show
progress for the work the per-step ``callback`` does not cover.

A listener is ``listener(event, component, details)``; it is set for a block of code with
``listening(listener)`` (a context variable: it follows the code that runs the pipeline and is
``None``, a no-op, everywhere else). The events, each sent once per occurrence, never per step:

- ``"compile"`` / ``"compiled"``: ``Component`` compiles (``details``: ``backend``, the one asked
  for; on ``"compiled"`` also ``seconds`` and ``backend``, the one that compiled it). Under
  ``memory="offload"`` every use compiles, so these come with every use.
- ``"first run"`` / ``"first ran"``: a component's first use (``seconds`` on the second).
- ``"tile"``: a tiled VAE pass finished a tile (``index`` from 1, ``total``).

``sdkit generate`` prints them (``sdkit.cli.progress_report``); a listener that raises stops the
generation, as a step callback does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

PhaseListener = Callable[[str, str, Mapping[str, Any]], None]

_listener: ContextVar[PhaseListener | None] = ContextVar("sdkit_phase_listener", default=None)


@contextlib.contextmanager
def listening(listener: PhaseListener | None) -> Iterator[None]:
    """Send the phase events of the code run inside the block to ``listener``."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def report(event: str, component: str = "", **details: Any) -> None:
    """Tell the listener, if there is one, that ``event`` happened to ``component``."""
    listener = _listener.get()
    if listener is not None:
        listener(event, component, details)
