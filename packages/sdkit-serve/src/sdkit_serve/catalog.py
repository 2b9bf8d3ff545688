"""The models a server offers, named as AUTOMATIC1111 names them.

``--ckpt-dir`` is scanned as A1111 scans ``models/Stable-diffusion``: every ``.safetensors``
file in it and its subfolders (``*.vae.safetensors`` excepted: those are VAEs), plus every
diffusers or ONNX pipeline folder (a folder holding ``model_index.json``; nothing inside one is
scanned further). ``--vae-dir`` gives the VAE files, by file name, as A1111's ``sd_vae``
option takes them. ``--model PATH`` adds one model by its own name.

Names follow A1111's ``CheckpointInfo``: ``name`` is the path relative to the folder
(``sub/model.safetensors``), ``model_name`` the same with ``/`` as ``_`` and no extension,
``hash`` the first 10 hex digits of the file's sha256 once known (A1111 computes it when a
model is first loaded, and so do we: it is kept in ``SDKIT_CACHE_DIR``), and ``title`` is
``name [hash]``, or ``name`` while the hash is unknown. A client may name a model by any of
those (and by A1111's legacy 8-digit hash); nothing else is looked up, so a name can never reach
a file outside the folders: a path, ``../x`` or a link that leaves its folder is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from sdkit.errors import InputError, ModelFormatError, did_you_mean
from sdkit.files import inside

log = logging.getLogger("sdkit_serve")

WEIGHT_SUFFIXES = (".safetensors",)
VAE_SUFFIXES = (".vae.safetensors",)
AUTOMATIC, NO_VAE = "Automatic", "None"  # A1111's two sd_vae values that name no file
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    """One model the server offers (a file or a pipeline folder), with A1111's names for it."""

    name: str  # relative to its folder, "/"-separated: "sub/model.safetensors", "sd15-onnx"
    path: Path  # absolute; never sent to clients
    root: Path | None  # the scanned folder it lies in (None: given with --model)
    sha256: str | None = None
    legacy_hash: str | None = None  # A1111's old 8-digit hash: sha256 of 64 KiB at 1 MiB

    @property
    def is_file(self) -> bool:
        return self.path.is_file()

    @property
    def stem(self) -> str:
        """The file name without its extension (A1111's ``name_for_extra``)."""
        base = self.name.rsplit("/", 1)[-1]
        return base[: -len(Path(base).suffix)] if Path(base).suffix.lower() in WEIGHT_SUFFIXES else base

    @property
    def model_name(self) -> str:
        base = self.name[: -len(Path(self.name).suffix)] if self.is_weight_file else self.name
        return base.replace("/", "_").replace("\\", "_")

    @property
    def is_weight_file(self) -> bool:
        return Path(self.name).suffix.lower() in WEIGHT_SUFFIXES

    @property
    def shorthash(self) -> str | None:
        return self.sha256[:10] if self.sha256 else None

    @property
    def title(self) -> str:
        return f"{self.name} [{self.shorthash}]" if self.shorthash else self.name

    @property
    def short_title(self) -> str:
        return f"{self.stem} [{self.shorthash}]" if self.shorthash else self.stem

    def aliases(self) -> set[str]:
        """Every string A1111 accepts for this model (its ``CheckpointInfo.ids``)."""
        ids = {self.name, self.model_name, self.title, self.stem}
        if self.legacy_hash:
            ids |= {self.legacy_hash, f"{self.name} [{self.legacy_hash}]"}
        if self.sha256 and self.shorthash:
            ids |= {self.shorthash, self.sha256, self.short_title}
        return ids

    def checked_path(self) -> Path:
        """The path to load, checked again now: a file replaced by a link out of its folder
        since the scan is refused."""
        if self.root is None:
            return self.path
        try:
            return inside(self.root, self.path.relative_to(self.root), "model")
        except (ModelFormatError, ValueError):
            raise InputError(f"model {self.name!r} now points outside its folder (refused)") from None

    def item(self) -> dict[str, str | None]:
        """``/sdapi/v1/sd-models``'s entry. ``filename`` is relative to the model folder: the
        server does not tell clients where its files are."""
        return {
            "title": self.title,
            "model_name": self.model_name,
            "hash": self.shorthash,
            "sha256": self.sha256,
            "filename": self.name,
            "config": None,
        }


@dataclass(frozen=True)
class VaeFile:
    name: str  # the file name, as A1111's sd_vae option names it
    path: Path
    root: Path


def scan(root: Path, *, vae: bool = False) -> Iterable[tuple[str, Path]]:
    """``(name, path)`` of every model (or, with ``vae``, every VAE file) under ``root``,
    sorted; anything whose real path leaves ``root`` (a link out) is skipped with a warning."""
    real_root = root.resolve()
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(real_root):
        here = Path(folder)
        if not vae and (here / "model_index.json").is_file() and here != real_root:
            dirs.clear()  # a pipeline folder: one model, nothing inside it is scanned
            found.append((here.relative_to(real_root).as_posix(), here))
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for link in [d for d in dirs if (here / d).is_symlink()]:  # os.walk does not enter links
            if (here / link / "model_index.json").is_file() and not vae:
                found.append(((here / link).relative_to(real_root).as_posix(), here / link))
        for name in sorted(files):
            lower = name.lower()
            is_vae = lower.endswith(VAE_SUFFIXES)
            if (vae and (is_vae or lower.endswith(WEIGHT_SUFFIXES))) or (
                not vae and lower.endswith(WEIGHT_SUFFIXES) and not is_vae
            ):
                found.append(((here / name).relative_to(real_root).as_posix(), here / name))
    for name, path in sorted(found):
        try:
            inside(real_root, path.relative_to(real_root), "model")
        except ModelFormatError:
            log.warning("skipping %s in %s: it links outside the folder", name, root)
            continue
        yield name, path


class HashCache:
    """sha256 sums of model files by path, size and mtime, in ``SDKIT_CACHE_DIR`` (as A1111's
    ``cache.json``): a large checkpoint is read through once, not at every start."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._sums: dict[str, dict[str, object]] = {}
        if path is not None and path.is_file():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
                self._sums = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                log.warning("ignoring an unreadable hash cache %s", path)

    @staticmethod
    def _stamp(path: Path) -> dict[str, object]:
        stat = path.stat()
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    def known(self, path: Path) -> str | None:
        entry = self._sums.get(str(path))
        if not isinstance(entry, dict) or not path.is_file():
            return None
        sha = entry.get("sha256")
        same = {k: entry.get(k) for k in ("size", "mtime_ns")} == self._stamp(path)
        return sha if isinstance(sha, str) and same else None

    def compute(self, path: Path) -> str:
        """The file's sha256 (from the cache when its size and mtime have not changed)."""
        cached = self.known(path)
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(_HASH_CHUNK):
                digest.update(chunk)
        sha = digest.hexdigest()
        with self._lock:
            self._sums[str(path)] = {**self._stamp(path), "sha256": sha}
            self._save()
        return sha

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as tmp:
                json.dump(self._sums, tmp)
            Path(tmp.name).replace(self.path)
        except OSError as exc:  # a read-only cache costs a re-hash next time, nothing else
            log.warning("cannot write the hash cache %s: %s", self.path, exc)


def legacy_hash(path: Path) -> str | None:
    """A1111's old model hash: the sha256 of the 64 KiB at offset 1 MiB, 8 hex digits."""
    if not path.is_file():
        return None
    with path.open("rb") as file:
        file.seek(0x100000)
        return hashlib.sha256(file.read(0x10000)).hexdigest()[:8]


class ModelCatalog:
    """The checkpoints and VAE files a server offers, refreshed on demand
    (``/sdapi/v1/refresh-checkpoints``, ``/refresh-vae``)."""

    def __init__(
        self,
        models: Iterable[Path] = (),
        ckpt_dir: Path | None = None,
        vae_dir: Path | None = None,
        hash_cache: Path | None = None,
    ) -> None:
        self.models = tuple(Path(p).absolute() for p in models)
        self.ckpt_dir = ckpt_dir
        self.vae_dir = vae_dir
        self.hashes = HashCache(hash_cache)
        self._lock = threading.Lock()
        self.checkpoints: dict[str, Checkpoint] = {}
        self.vaes: dict[str, VaeFile] = {}
        self.refresh_checkpoints()
        self.refresh_vaes()

    def refresh_checkpoints(self) -> None:
        found: dict[str, Checkpoint] = {}
        for path in self.models:
            found[path.name] = self._checkpoint(path.name, path, None)
        if self.ckpt_dir is not None:
            root = self.ckpt_dir.resolve()
            for name, path in scan(root):
                found.setdefault(name, self._checkpoint(name, path, root))
        with self._lock:
            self.checkpoints = found

    def _checkpoint(self, name: str, path: Path, root: Path | None) -> Checkpoint:
        known = self.hashes.known(path) if path.is_file() else None
        old = self.checkpoints.get(name)
        legacy = old.legacy_hash if old is not None and old.path == path else legacy_hash(path)
        return Checkpoint(name, path, root, sha256=known, legacy_hash=legacy)

    def refresh_vaes(self) -> None:
        found: dict[str, VaeFile] = {}
        for folder, vae_only in ((self.vae_dir, False), (self.ckpt_dir, True)):
            if folder is None:
                continue
            root = folder.resolve()
            for _, path in scan(root, vae=True):
                if not vae_only or path.name.lower().endswith(VAE_SUFFIXES):
                    found.setdefault(path.name, VaeFile(path.name, path, root))
        with self._lock:
            self.vaes = dict(sorted(found.items()))

    def hashed(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` with its sha256 (computed now for a file loaded the first time; a
        folder has none), and the catalogue updated: its title gains ``[hash]``, as in A1111."""
        if checkpoint.sha256 is not None or not checkpoint.path.is_file():
            return checkpoint
        updated = replace(checkpoint, sha256=self.hashes.compute(checkpoint.path))
        with self._lock:
            if self.checkpoints.get(checkpoint.name) == checkpoint:
                self.checkpoints[checkpoint.name] = updated
        return updated

    # -- lookups ----------------------------------------------------------------------------

    def find(self, text: object, *, closest: bool = False) -> Checkpoint:
        """The checkpoint a client names: any of its A1111 aliases (title, name, model name,
        stem, hashes), or a title whose ``[hash]`` is stale. ``closest``: also the shortest title
        containing ``text``, as A1111 matches ``override_settings`` and ``refiner_checkpoint``."""
        wanted = str(text).strip()
        checkpoints = list(self.checkpoints.values())
        # A1111 on Windows (and Easy Diffusion there) names subfolders with backslashes
        for candidate in (wanted, wanted.split(" [")[0].strip(), wanted.split(" [")[0].strip().replace("\\", "/")):
            matches = [c for c in checkpoints if candidate in c.aliases()]
            if matches:
                return matches[0]
        if closest and wanted:
            near = sorted((c for c in checkpoints if wanted in c.title), key=lambda c: len(c.title))
            if near:
                return near[0]
        names = [c.name for c in checkpoints]
        raise InputError(
            f"unknown model {wanted!r}{did_you_mean(wanted, names)}; models: {', '.join(names) or 'none'} "
            "(see /sdapi/v1/sd-models)"
        )

    def vae(self, option: object, checkpoint: Checkpoint) -> VaeFile | None:
        """The VAE file an ``sd_vae`` value asks for with ``checkpoint``: None for ``"None"``
        (the model's own); for ``"Automatic"`` a VAE whose file name starts with the
        checkpoint's (A1111's ``find_vae_near_checkpoint``), else None; else the named file."""
        text = AUTOMATIC if option is None else str(option).strip()
        if text == NO_VAE:
            return None
        if text == AUTOMATIC:
            return next((v for v in self.vaes.values() if v.name.startswith(checkpoint.stem + ".")), None)
        found = self.vaes.get(text) or next((v for v in self.vaes.values() if Path(v.name).stem == text), None)
        if found is None:
            names = list(self.vaes)
            raise InputError(
                f"unknown VAE {text!r}{did_you_mean(text, names)}; choose {AUTOMATIC!r}, {NO_VAE!r} or one of "
                f"{', '.join(names) or 'none (no --vae-dir)'} (see /sdapi/v1/sd-vae)"
            )
        return found

    def check_vae_option(self, option: object) -> str:
        """``option`` as a valid ``sd_vae`` value, or an InputError."""
        text = str(option).strip()
        if text not in (AUTOMATIC, NO_VAE):
            self.vae(text, Checkpoint("", Path(), None))
        return text if text in (AUTOMATIC, NO_VAE) or text in self.vaes else self._vae_name(text)

    def _vae_name(self, text: str) -> str:
        return next(v.name for v in self.vaes.values() if Path(v.name).stem == text)
