"""Progress bars for long work: tqdm on a terminal, silent in pipes and logs."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def interactive() -> bool:
    return sys.stderr.isatty()


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "", **kwargs: Any) -> Iterator[T]:
    """Iterate with a progress bar on stderr when it is a terminal."""
    from tqdm import tqdm

    yield from tqdm(iterable, total=total, desc=desc, disable=not interactive(), leave=False, file=sys.stderr, **kwargs)
