"""The on-disk compiled-artifact cache.

Key: graph hash, backend name and version, device, options, input shapes, and the weights
hash where the backend cannot refit, plus sdkit's version and the cache format. An entry is
a folder with the backend's files and a manifest of their sha256 sums; an entry whose
manifest is missing, does not match its key, or whose files do not match their sums is
deleted and rebuilt, never trusted. Writes go to a temporary folder renamed into place, so
a crash leaves no half-written entry behind. A cache that cannot be written (read-only, full,
not a folder) never fails a compile: the artifact is built in a scratch folder, used, and
dropped, with a ``CacheWarning``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sdkit._version import __version__
from sdkit.errors import CacheError

FORMAT = 1
MANIFEST = "sdkit-manifest.json"
T = TypeVar("T")


class CacheWarning(UserWarning):
    """The compiled-artifact cache could not be used; the work was done without it."""


def warn_unwritable(where: Path, exc: OSError | CacheError) -> None:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    warnings.warn(f"cannot write the artifact cache at {where} ({reason}); compiling without it", CacheWarning, 3)


def cache_root() -> Path:
    """``SDKIT_CACHE_DIR`` or the platform's user cache folder, ``.../sdkit``."""
    env = os.environ.get("SDKIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("sdkit", appauthor=False))


def _file_sums(folder: Path) -> dict[str, str]:
    sums: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            sums[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return sums


def make_key(
    *,
    graph_hash: str,
    backend: str,
    backend_version: str,
    device: str,
    options: Mapping[str, Any],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    weights_hash: str | None = None,
) -> dict[str, Any]:
    """The fields that decide whether a compiled artifact can be reused."""
    return {
        "format": FORMAT,
        "sdkit": __version__,
        "graph": graph_hash,
        "backend": backend,
        "backend_version": backend_version,
        "device": device,
        "options": dict(options),
        "input_shapes": {k: list(v) for k, v in sorted((input_shapes or {}).items())},
        "weights": weights_hash,
    }


def key_digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


class ArtifactCache:
    """Folders of compiled artifacts under ``root/<backend>/<digest>``."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_root()) / "artifacts"

    def entry_dir(self, key: Mapping[str, Any]) -> Path:
        return self.root / str(key.get("backend", "any")) / key_digest(key)

    def lookup(self, key: Mapping[str, Any]) -> Path | None:
        """The entry's folder if it is present and intact; a damaged entry is removed."""
        folder = self.entry_dir(key)
        try:
            if not folder.is_dir():
                return None
            manifest = json.loads((folder / MANIFEST).read_text())
            intact = (
                isinstance(manifest, dict)
                and manifest.get("key") == json.loads(json.dumps(key, default=str))
                and manifest.get("files") == _file_sums(folder)
            )
        except (OSError, ValueError):
            intact = False
        if not intact:
            self.invalidate(key)
            return None
        return folder

    def store(
        self, key: Mapping[str, Any], build: Callable[[Path], None], uncached: Callable[[Path], None] | None = None
    ) -> Path | None:
        """Run ``build(tmp_folder)`` and move the result into place with its manifest. When
        the cache cannot be written, ``build`` runs in a scratch folder, ``uncached(folder)``
        (if given) may use what it built, the folder is removed, a ``CacheWarning`` says so,
        and the answer is None."""
        folder = self.entry_dir(key)
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        except OSError as exc:
            warn_unwritable(self.root, exc)
            with tempfile.TemporaryDirectory(prefix="sdkit-uncached-") as scratch:
                build(Path(scratch))
                if uncached is not None:
                    uncached(Path(scratch))
            return None
        try:
            build(tmp)
            try:
                self._commit(key, tmp, folder)
            except (OSError, CacheError) as exc:
                warn_unwritable(self.root, exc)
                if uncached is not None:
                    uncached(tmp)
                return None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return folder

    def _commit(self, key: Mapping[str, Any], tmp: Path, folder: Path) -> None:
        manifest = {"key": json.loads(json.dumps(key, default=str)), "files": _file_sums(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if self.lookup(key) is not None:  # (lookup removes a damaged entry)
            return  # another process stored it meanwhile: the first writer wins
        try:
            tmp.replace(folder)
        except OSError:
            if self.lookup(key) is None:
                raise CacheError(f"cannot write the artifact cache entry {folder}") from None

    def invalidate(self, key: Mapping[str, Any]) -> None:
        shutil.rmtree(self.entry_dir(key), ignore_errors=True)

    def load_or_build(
        self,
        key: Mapping[str, Any],
        build: Callable[[Path], None],
        load: Callable[[Path], T],
    ) -> tuple[T, bool]:
        """Load a cached entry, or build, store and load it. Returns (value, was_cached).
        An entry that fails to load is treated as corrupt: removed and rebuilt once."""
        folder = self.lookup(key)
        if folder is not None:
            try:
                return load(folder), True
            except Exception:
                self.invalidate(key)
        loaded: list[T] = []  # when the cache is not writable (warned): loaded from scratch
        stored = self.store(key, build, uncached=lambda scratch: loaded.append(load(scratch)))
        if stored is None:
            return loaded[0], False
        return load(stored), False

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
