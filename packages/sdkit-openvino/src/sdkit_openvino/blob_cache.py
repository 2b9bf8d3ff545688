"""OpenVINO's own model cache (``CACHE_DIR``), verified before every use.

OpenVINO writes compiled blobs into ``CACHE_DIR`` and imports them on the next compile without
any integrity check: 4 KiB flipped in a blob gave wrong outputs on every later run, exit 0. So
sdkit keeps a manifest of the sha256 of every file OpenVINO wrote there, as ``ArtifactCache``
does for its own entries:

- before a compile, every file of the folder whose sum is not the manifest's (tampered,
  truncated, unknown, unreadable) is removed, so OpenVINO rebuilds it instead of trusting it;
- after the compile, the files OpenVINO added are recorded;
- an exclusive lock on the folder covers the three steps, so two processes (or threads)
  compiling the same model into one cache take turns: the second imports the first's blob;
- a folder that cannot be created, locked, cleaned or recorded turns the cache off for that
  compile with a ``CacheWarning``, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from sdkit.cache import CacheWarning

MANIFEST = "sdkit-blobs.json"
LOCK = ".sdkit-lock"
_OWN = (MANIFEST, LOCK)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in _OWN)


def _read_manifest(folder: Path) -> dict[str, str]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: nothing in the folder is trusted
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def drop_untrusted(folder: Path) -> dict[str, str]:
    """Remove every file whose sum differs from the manifest's; returns the trusted sums."""
    manifest = _read_manifest(folder)
    trusted: dict[str, str] = {}
    for path in _files(folder):
        name = path.relative_to(folder).as_posix()
        try:
            good = name in manifest and _sha256(path) == manifest[name]
        except OSError:
            good = False
        if good:
            trusted[name] = manifest[name]
        else:
            path.unlink()  # OSError here: the folder cannot be made trustworthy
    return trusted


def record(folder: Path, trusted: dict[str, str]) -> None:
    """Add the sums of the files written since ``drop_untrusted`` to the manifest (atomically)."""
    sums = dict(trusted)
    for path in _files(folder):
        name = path.relative_to(folder).as_posix()
        if name not in sums:
            sums[name] = _sha256(path)
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(sums, indent=1, sort_keys=True))
    tmp.replace(folder / MANIFEST)


def _lock(handle: int) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no inter-process lock, sums still checked
        return
    fcntl.flock(handle, fcntl.LOCK_EX)


def _uncached(folder: Path, exc: OSError) -> None:
    warnings.warn(
        f"openvino: cannot use the model cache at {folder} ({exc.strerror or exc}); compiling without it",
        CacheWarning,
        stacklevel=4,
    )


@contextlib.contextmanager
def verified_cache_dir(folder: Path | None) -> Iterator[Path | None]:
    """The folder to hand OpenVINO as ``CACHE_DIR`` for one compile, or None to compile
    without a cache (``folder`` None, or unusable: warned). Locked for the whole block."""
    if folder is None:
        yield None
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        _uncached(folder, exc)
        yield None
        return
    try:
        _lock(handle)
        try:
            trusted: dict[str, str] | None = drop_untrusted(folder)
        except OSError as exc:
            _uncached(folder, exc)
            trusted = None
        yield folder if trusted is not None else None
        if trusted is not None:
            try:
                record(folder, trusted)
            except OSError as exc:  # the next compile will not trust (and will redo) these blobs
                _uncached(folder, exc)
    finally:
        os.close(handle)  # releases the lock
