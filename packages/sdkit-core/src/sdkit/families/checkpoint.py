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
from sdkit.families.safetensors_reader import FLOATS, SafetensorsFile, TensorEntry
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
    """One graph initializer read from a checkpoint on demand (a ``LazyArray``).

    ``scale``: the ``<layer>.scale_weight`` of a ComfyUI scaled-fp8 weight (same file): the
    weight read is ``stored.astype(float32) * scale``, before the source's rows, transpose and
    swap are taken (a per-output-channel scale: the same rows of it)."""

    file: SafetensorsFile
    entry: TensorEntry
    source: TensorSource
    shape: tuple[int, ...]
    dtype: np.dtype[Any] = field(default_factory=lambda: np.dtype(np.float32))
    scale: TensorEntry | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def load(self) -> np.ndarray:
        if self.scale is None:
            array = self.file.read(self.entry, self.dtype, self.source.rows)
        else:
            array = self.file.read(self.entry, np.float32, self.source.rows)
            array = (array * self._scale(array.ndim)).astype(self.dtype, copy=False)
        if self.source.transpose:
            array = array.T
        if self.source.swap_halves:
            half = array.shape[0] // 2
            array = np.concatenate([array[half:], array[:half]])
        return np.ascontiguousarray(array).reshape(self.shape)

    def _scale(self, ndim: int) -> np.ndarray:
        """The scale as float32, one number or one per row read (broadcast over the other axes)."""
        assert self.scale is not None
        scale = self.file.read(self.scale, np.float32).reshape(-1)
        if scale.size == 1:
            return scale.reshape(())
        if self.source.rows is not None:
            scale = scale[self.source.rows[0] : self.source.rows[1]]
        return scale.reshape((-1,) + (1,) * (ndim - 1))


# ComfyUI's "scaled fp8" files (flux1-dev-fp8-scaled, t5xxl_fp8_e4m3fn_scaled,
# sd3.5_large_fp8_scaled...) store a layer's weight as float8_e4m3fn beside ``<layer>.scale_weight``:
# the weight is ``stored * scale_weight`` (ComfyUI's ``scaled_fp8_ops``: a float32 scalar; one per
# output channel, ``[out]`` or ``[out, 1]``, is read too). ``<layer>.scale_input`` scales the
# activations of an fp8 matmul and is not needed when computing in fp32; the ``scaled_fp8`` marker
# tensor (empty or 2 elements, its dtype the weights') only flags the format. All three are
# consumed here: the mapping never sees them. ComfyUI's newer quantized files
# (``_quantization_metadata``, ``<layer>.comfy_quant``: int8/fp8/nvfp4 per layer) are refused.
SCALE_WEIGHT, SCALE_INPUT = ".scale_weight", ".scale_input"


def _is_marker(key: str) -> bool:
    return key == "scaled_fp8" or key.endswith(".scaled_fp8")


def refuse_quantized(file: SafetensorsFile) -> None:
    """``ModelFormatError`` naming the format when ``file`` is one of ComfyUI's newer quantized files."""
    found = next((k for k in file.entries if k.endswith(".comfy_quant")), None)
    if found is None and "_quantization_metadata" not in file.metadata:
        return
    named = f"tensor {found!r}" if found else "_quantization_metadata"
    raise ModelFormatError(
        f"{file.path.name} is a ComfyUI quantized checkpoint ({named}): its per-layer int8/fp8/nvfp4 formats "
        "are not read by sdkit; use the file's fp16/bf16, fp8_e4m3fn or scaled fp8 release"
    )


def weight_scales(file: SafetensorsFile) -> tuple[dict[str, TensorEntry], set[str]]:
    """A scaled-fp8 file's ``{weight key: its scale_weight entry}`` and the keys it consumes (the
    scales, the input scales, the marker); checked against the weights' shapes (header only)."""
    scales: dict[str, TensorEntry] = {}
    consumed = {k for k in file.entries if _is_marker(k) or k.endswith(SCALE_INPUT)}
    for key, entry in file.entries.items():
        if not key.endswith(SCALE_WEIGHT):
            continue
        consumed.add(key)
        weight = file.entries.get(key[: -len(SCALE_WEIGHT)] + ".weight")
        problem = None
        if weight is None:
            problem = "has no weight beside it"
        elif entry.dtype not in FLOATS:
            problem = f"is {entry.dtype}, not a float"
        elif entry.size != 1 and not (
            weight.shape and entry.shape and entry.shape[0] == weight.shape[0] and entry.size == weight.shape[0]
        ):
            problem = (
                f"has shape {list(entry.shape)}: a scale is one number or one per output channel "
                f"of the weight {list(weight.shape)}"
            )
        if problem:
            raise ModelFormatError(f"{file.path.name}: the scaled fp8 tensor {key!r} {problem}")
        assert weight is not None
        scales[weight.key] = entry
    return scales, consumed


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
        self._scales: dict[str, TensorEntry] = {}  # a scaled-fp8 weight's key -> its scale_weight
        for prefix, file in files:
            refuse_quantized(file)
            scales, consumed = weight_scales(file)
            if prefix and prefix in self._replacing:
                for key in [k for k in self._tensors if k.startswith(prefix)]:
                    del self._tensors[key]
                    self._scales.pop(key, None)
            for key, entry in file.entries.items():
                if key not in consumed:
                    self._tensors[prefix + key] = (file, entry)
                    self._scales.pop(prefix + key, None)
            self._scales.update({prefix + key: scale for key, scale in scales.items()})

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
        shape = tuple(int(d) for d in shape)
        return CheckpointTensor(file, entry, source, shape, np.dtype(dtype), self._scales.get(key))

    def scale(self, key: str) -> TensorEntry | None:
        """The ``scale_weight`` entry of a ComfyUI scaled-fp8 weight, ``None`` for a plain one."""
        return self._scales.get(key)

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
