"""Lazy access to coremltools: import (quietly), version, deployment targets, platform facts.

coremltools installs on Linux and converts there (the MIL builder and ``ct.convert`` are pure
Python), but its Core ML runtime (``libcoremlpython``, prediction) exists only on macOS.
"""

from __future__ import annotations

import contextlib
import io
import logging
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, OptionError
from sdkit.known_backends import install_command

BACKEND_NAME = "coreml"
INSTALL_HINT = f"on a Mac: {install_command('apple')}"
MIN_VERSION = (8, 0)


@dataclass(frozen=True)
class Target:
    """A minimum deployment target: sdkit's name and coremltools' ``ct.target`` member."""

    name: str  # "macOS13"
    member: str  # attribute of ``coremltools.target``
    sdpa: bool  # scaled_dot_product_attention is available (macOS 15 / iOS 18)

    @property
    def mil_opset(self) -> object:
        return getattr(import_coremltools().target, self.member)


TARGETS = {
    "macOS13": Target("macOS13", "macOS13", sdpa=False),
    "macOS14": Target("macOS14", "macOS14", sdpa=False),
    "macOS15": Target("macOS15", "macOS15", sdpa=True),
}
DEFAULT_TARGET = "macOS13"  # the oldest that runs fp16 ML programs on every Apple silicon Mac


def target_named(name: str) -> Target:
    if name not in TARGETS:
        raise OptionError(f"target must be one of {', '.join(TARGETS)}, not {name!r}")
    return TARGETS[name]


def import_coremltools() -> ModuleType:
    """``import coremltools`` without its warnings about the runtime missing off macOS."""
    quiet = logging.getLogger("coremltools")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import coremltools
    except ImportError as exc:
        raise BackendUnavailableError(BACKEND_NAME, f"coremltools is not installed ({exc})", INSTALL_HINT) from None
    finally:
        quiet.setLevel(level)
    module: ModuleType = coremltools
    return module


def coremltools_version() -> str | None:
    """The installed coremltools version without importing it, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coremltools")
    except PackageNotFoundError:
        return None


def version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def on_macos() -> bool:
    """Whether this is macOS, the one platform Core ML runs on. A call rather than an inline
    ``sys.platform`` test, which mypy evaluates for the platform it checks on and then calls the
    other branch unreachable (the package is type-checked on Linux and on macOS alike)."""
    return sys.platform == "darwin"


def runtime_available() -> tuple[bool, str]:
    """Whether coremltools' Core ML runtime binding (prediction) loads here, and why not."""
    if not on_macos():
        return False, f"Core ML runs on macOS only (this is {sys.platform})"
    try:
        import_coremltools()
        from coremltools import libcoremlpython  # noqa: F401
    except BackendUnavailableError as exc:
        return False, exc.reason
    except ImportError as exc:
        return False, f"coremltools has no Core ML runtime binding here ({exc})"
    return True, ""


def apple_devices(machine: str | None = None) -> list[Device]:
    """Core ML compute units: the Neural Engine and GPU on Apple silicon, always the CPU."""
    machine = machine or platform.machine()
    devices = [Device("cpu")]
    if machine == "arm64":
        devices = [Device("ane", description="Apple Neural Engine"), Device("gpu", 0, "Apple GPU"), *devices]
    return devices


@contextlib.contextmanager
def quiet_conversion() -> Iterator[None]:
    """Silence coremltools' per-pass progress bars and int64 narrowing notes (sdkit's CLI shows
    its own progress; integers are int32 in Core ML by design)."""
    quiet = logging.getLogger("coremltools")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        quiet.setLevel(level)


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines or [type(exc).__name__])[0][:400]
