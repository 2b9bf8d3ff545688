"""A user's checkpoint: one ``.safetensors`` file (LDM/SGM or diffusers keys) or a diffusers
folder (``unet/diffusion_pytorch_model.safetensors``, ``text_encoder/model.safetensors``...),
seen as one key -> tensor index; plus the A1111 ``.yaml`` beside a file.

Nothing is read but the headers until a tensor is asked for: ``tensor(source, shape)`` returns a
``CheckpointTensor``, the ``LazyArray`` a ``WeightSet`` holds, which reads and converts its
tensor from the memory-mapped file each time it is loaded.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import ModelFormatError, OptionError
from sdkit.families.keymaps import TensorSource
from sdkit.families.safetensors_reader import SafetensorsFile, TensorEntry
from sdkit.model import PICKLED_SUFFIXES, pickle_refusal

# The component folders of a diffusers pipeline whose weights a family reads.
DIFFUSERS_FOLDERS = ("unet", "text_encoder", "text_encoder_2", "vae")
_WEIGHTS_FILE = re.compile(r"^(diffusion_pytorch_model|model)(\.fp16)?(-\d+-of-\d+)?\.safetensors$")
DTYPE_NAMES = {
    "F32": "fp32",
    "F16": "fp16",
    "BF16": "bf16",
    "F64": "fp64",
    "F8_E4M3": "fp8_e4m3",
    "F8_E5M2": "fp8_e5m2",
}
PREDICTIONS = {"epsilon": "epsilon", "eps": "epsilon", "v": "v_prediction", "v_prediction": "v_prediction"}


def normalize_prediction(value: str | None) -> str | None:
    """``"v"``/``"v_prediction"`` -> ``"v_prediction"``, ``"eps"``/``"epsilon"`` -> ``"epsilon"``."""
    if value is None:
        return None
    found = PREDICTIONS.get(str(value).strip().lower())
    if found is None:
        raise OptionError(f"unknown prediction type {value!r}; use one of: epsilon (eps), v_prediction (v)")
    return found


def is_diffusers_folder(path: Path) -> bool:
    """A folder with ``model_index.json`` and a ``unet/`` holding safetensors weights."""
    if not (path.is_dir() and (path / "model_index.json").is_file() and (path / "unet").is_dir()):
        return False
    return any(_WEIGHTS_FILE.match(p.name) for p in (path / "unet").iterdir())


def _folder_files(folder: Path) -> list[Path]:
    """A component folder's weight files: the full-precision ones (shards included), else the
    ``.fp16`` variant, as diffusers picks them."""
    found = sorted(p for p in folder.iterdir() if _WEIGHTS_FILE.match(p.name)) if folder.is_dir() else []
    plain = [p for p in found if ".fp16" not in p.name]
    return plain or found


@dataclass(frozen=True, eq=False)
class CheckpointTensor:
    """One graph initializer read from a checkpoint on demand (a ``LazyArray``)."""

    file: SafetensorsFile
    entry: TensorEntry
    source: TensorSource
    shape: tuple[int, ...]
    dtype: np.dtype[Any] = field(default_factory=lambda: np.dtype(np.float32))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def load(self) -> np.ndarray:
        array = self.file.read(self.entry, self.dtype, self.source.rows)
        if self.source.transpose:
            array = array.T
        if self.source.swap_halves:
            half = array.shape[0] // 2
            array = np.concatenate([array[half:], array[:half]])
        return np.ascontiguousarray(array).reshape(self.shape)


# ComfyUI's "scaled fp8" files (flux1-dev-fp8-scaled, t5xxl_fp8_e4m3fn_scaled...) store each
# weight as fp8 to be multiplied by its own ``<layer>.scale_weight`` (a ``scaled_fp8`` marker
# tensor beside them; ``.scale_input`` for fp8 matmuls), and its newer quantized files declare
# ``_quantization_metadata`` and ``<layer>.comfy_quant``. Read as plain weights they would run
# unscaled (wrong images, the scales left over as unused keys): refused by name instead.
COMFY_SCALE_SUFFIXES = (".scale_weight", ".scale_input", ".comfy_quant")


def refuse_scaled_fp8(file: SafetensorsFile) -> None:
    """``ModelFormatError`` naming the format when ``file`` is a ComfyUI scaled-fp8/quantized file."""
    marker = next((k for k in file.entries if k == "scaled_fp8" or k.endswith(".scaled_fp8")), None)
    scaled = marker or next((k for k in file.entries if k.endswith(COMFY_SCALE_SUFFIXES)), None)
    if scaled is None and "_quantization_metadata" not in file.metadata:
        return
    found = f"tensor {scaled!r}" if scaled else "_quantization_metadata"
    raise ModelFormatError(
        f"{file.path.name} is a ComfyUI scaled fp8 checkpoint ({found}): each weight needs its own scale, "
        "which sdkit does not apply; use the file's fp16/bf16 (or plain fp8_e4m3fn) release"
    )


class Checkpoint:
    """Every tensor of a checkpoint by key: one file, or a diffusers folder's files under
    ``<component folder>.`` prefixes (the keys a diffusers-layout single file has)."""

    def __init__(self, path: Path, files: Sequence[tuple[str, SafetensorsFile]], replacing: Sequence[str] = ()) -> None:
        """``files``: (key prefix, file) in order. A file whose prefix is in ``replacing`` (a
        component file, ``with_files``) replaces the keys earlier files have under that prefix."""
        self.path = path
        self.files = [f for _, f in files]
        self._prefixed_files = list(files)
        self._replacing = tuple(replacing)
        self._tensors: dict[str, tuple[SafetensorsFile, TensorEntry]] = {}
        for prefix, file in files:
            refuse_scaled_fp8(file)
            if prefix and prefix in self._replacing:
                for key in [k for k in self._tensors if k.startswith(prefix)]:
                    del self._tensors[key]
            for key, entry in file.entries.items():
                self._tensors[prefix + key] = (file, entry)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """Read the headers of a ``.safetensors`` file or a diffusers folder (pickles refused)."""
        path = Path(path).expanduser()
        if path.suffix.lower() in PICKLED_SUFFIXES:
            raise ModelFormatError(pickle_refusal(path.name))
        if not path.exists():
            raise ModelFormatError(f"checkpoint not found: {path}")
        if path.is_dir():
            return cls._open_folder(path)
        return cls(path, [("", SafetensorsFile(path))])

    def with_files(
        self, files: Mapping[str, str | os.PathLike[str]], prefixes: Mapping[str, str] | None = None
    ) -> Checkpoint:
        """This checkpoint plus other ``.safetensors`` files, each one's keys under
        ``prefixes[name]``, by default ``<name>.`` (a Flux transformer file with its ``clip_l.``,
        ``t5xxl.`` and ``vae.`` files). This checkpoint's own keys under a given file's prefix
        are replaced by the file's (an SD3 file's ``text_encoders.clip_l.transformer.``)."""
        extra: list[tuple[str, SafetensorsFile]] = []
        for name, file in files.items():
            path = Path(file).expanduser()
            if path.suffix.lower() in PICKLED_SUFFIXES:
                raise ModelFormatError(pickle_refusal(path.name))
            if not path.is_file():
                raise ModelFormatError(f"{name} file not found: {path}")
            extra.append(((prefixes or {}).get(name, f"{name}."), SafetensorsFile(path)))
        replacing = (*self._replacing, *(prefix for prefix, _ in extra))
        return Checkpoint(self.path, [*self._prefixed_files, *extra], replacing)

    @classmethod
    def _open_folder(cls, path: Path) -> Checkpoint:
        files: list[tuple[str, SafetensorsFile]] = []
        for component in DIFFUSERS_FOLDERS:
            folder = path / component
            for file in _folder_files(folder):
                files.append((f"{component}.", SafetensorsFile(file)))
            pickled = [p.name for p in folder.glob("*") if p.suffix in PICKLED_SUFFIXES] if folder.is_dir() else []
            if pickled and not _folder_files(folder):
                raise ModelFormatError(pickle_refusal(f"{component}/{pickled[0]}"))
        if not files:
            raise ModelFormatError(
                f"{path} holds no diffusers safetensors weights (unet/diffusion_pytorch_model.safetensors)"
            )
        return cls(path, files)

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name

    @property
    def is_folder(self) -> bool:
        return self.path.is_dir()

    def __contains__(self, key: object) -> bool:
        return key in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def entry(self, key: str) -> TensorEntry:
        return self._tensors[key][1]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: entry.shape for key, (_, entry) in self._tensors.items()}

    def dtypes(self, prefix: str = "") -> dict[str, int]:
        """Tensor count per dtype (``fp16``, ``bf16``, ``fp32``, ``I64``...), of keys in ``prefix``."""
        counts = Counter(
            DTYPE_NAMES.get(e.dtype, e.dtype) for k, (_, e) in self._tensors.items() if k.startswith(prefix)
        )
        return dict(counts.most_common())

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def metadata(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for file in self.files:
            merged.update(file.metadata)
        return merged

    def find(self, source: TensorSource) -> str | None:
        """The first of ``source.keys`` this checkpoint has."""
        return next((key for key in source.keys if key in self._tensors), None)

    def tensor(
        self, key: str, source: TensorSource, shape: Sequence[int], dtype: np.dtype[Any] | type = np.float32
    ) -> CheckpointTensor:
        """A lazy tensor: ``key`` read through ``source``'s transform as ``shape`` in ``dtype``."""
        file, entry = self._tensors[key]
        return CheckpointTensor(file, entry, source, tuple(int(d) for d in shape), np.dtype(dtype))

    def close(self) -> None:
        for file in self.files:
            file.close()


def a1111_yaml(path: Path) -> Path | None:
    """The A1111 config beside a checkpoint file (``model.safetensors`` -> ``model.yaml``)."""
    if path.is_dir():
        return None
    candidate = path.with_suffix(".yaml")
    return candidate if candidate.is_file() else None


def yaml_prediction(config: Path) -> str:
    """The prediction type an LDM/A1111 ``.yaml`` gives: ``model.params.parameterization`` ``"v"``
    -> ``v_prediction``; absent (LDM's default ``"eps"``) -> ``epsilon``.

    Parsed with PyYAML's ``safe_load`` (plain data only, never Python objects)."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFormatError(f"{config.name} is not a readable YAML config: {first}") from None
    params: Any = data.get("model", {}) if isinstance(data, dict) else {}
    params = params.get("params", {}) if isinstance(params, dict) else {}
    value = params.get("parameterization", "eps") if isinstance(params, dict) else "eps"
    if value not in ("eps", "v"):
        raise ModelFormatError(f"{config.name}: parameterization {value!r} is not supported (eps or v)")
    return "v_prediction" if value == "v" else "epsilon"
