"""Checkpoint merging as A1111's Checkpoint Merger does it (``modules/extras.py``), tensor by tensor.

    merge_checkpoints("a.safetensors", "b.safetensors", output="ab.safetensors", alpha=0.3)

- **weighted sum**: ``A * (1 - M) + B * M``; **add difference**: ``A + (B - C) * M``. As A1111:
  only keys containing ``model`` that B also has are merged (every LDM/SGM weight:
  ``model.diffusion_model.``, ``first_stage_model.``, ``cond_stage_model.``, ``conditioner.``'s
  ``...model...``); other keys of A are copied; a ``model`` key of B that A lacks is added (B's
  value, or ``B - C``); for add difference, a key C lacks counts as zero. An inpainting A (9
  input channels) or instruct-pix2pix A (8) merges its first 4 channels with a plain B's 4;
  the other way round is refused, as A1111 refuses it. Skipped as A1111 skips it: CLIP's
  ``position_ids``.
- **VAE**: merged like the rest by default; ``vae=FILE`` bakes a VAE file's tensors in over A's
  ``first_stage_model.*`` (LDM keys, as A1111's bake); ``keep_vae=True`` keeps A's unmerged.
- **LoRA** (``loras=[(file, strength)]``): baked into the result at a strength, through the
  family's key maps (``sdkit.families.lora.lora_deltas``: the same product ``sdkit generate
  --lora`` adds), each change placed back into the checkpoint tensor the graph weight is read
  from (rows, transpose and reshape undone).
- **dtype**: ``fp32`` for every float tensor; ``fp16`` as A1111's "save as float16" (the
  tensors the merge made; every one when there is no B); None: each tensor in A's dtype (bf16
  kept, rounded to nearest even). The arithmetic is float32 (A1111's is the tensors' dtype).

Memory: the output's header is computed from the inputs' headers, then each tensor is read
(one from each input), computed and written in turn, its pages dropped (``SafetensorsFile``):
a 7 GB SDXL merge holds a few tensors, not three checkpoints. The file is written beside the
output and renamed when complete.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import InputError, ModelFormatError
from sdkit.families.checkpoint import Checkpoint
from sdkit.families.detection import detect
from sdkit.families.family import Family
from sdkit.families.lora import lora_deltas
from sdkit.families.lora_file import LoraFile, open_lora
from sdkit.families.safetensors_reader import FLOATS, SafetensorsFile, TensorEntry
from sdkit.model import refuse_unsafe_or_missing

MODES = ("weighted-sum", "add-difference")
DTYPES = {"fp16": "F16", "fp32": "F32"}
SKIP_ON_MERGE = ("cond_stage_model.transformer.text_model.embeddings.position_ids",)
VAE_PREFIX = "first_stage_model."
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_ALIGN = 8  # tensor data offsets kept 8-byte aligned (the header padded with spaces)


def _open(path: str | os.PathLike[str], what: str) -> SafetensorsFile:
    path = Path(path)
    refuse_unsafe_or_missing(path, what)
    if path.is_dir():
        raise InputError(f"{what} {path} is a folder: the merger reads single .safetensors checkpoints")
    file = SafetensorsFile(path)
    if any(k.endswith((".scale_weight", ".comfy_quant")) or k == "scaled_fp8" for k in file.entries):
        raise ModelFormatError(f"{path.name} is a quantized (scaled fp8) checkpoint: the merger reads plain ones")
    return file


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even, as torch's ``.to(bfloat16)``."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.asarray(rounded, dtype=np.uint16)


@dataclass
class Planned:
    """One output tensor: its dtype and shape, and how it is made."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    how: str  # "merge", "copy-a", "from-b", "vae"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _SIZES[self.dtype]


@dataclass
class MergeReport:
    """What a merge did: tensors by how they were made, and the output."""

    output: Path
    counts: dict[str, int] = field(default_factory=dict)
    lora_keys: int = 0
    bytes_written: int = 0

    def summary(self) -> str:
        parts = ", ".join(f"{n} {how}" for how, n in sorted(self.counts.items()))
        lora = f", {self.lora_keys} changed by LoRA" if self.lora_keys else ""
        return f"{self.output}: {sum(self.counts.values())} tensors ({parts}{lora}), {self.bytes_written / 1e6:.1f} MB"


class Merger:
    """A merge planned from the headers; ``write`` streams it to a file."""

    def __init__(
        self,
        a: str | os.PathLike[str],
        b: str | os.PathLike[str] | None = None,
        c: str | os.PathLike[str] | None = None,
        *,
        mode: str = "weighted-sum",
        alpha: float = 0.5,
        dtype: str | None = None,
        vae: str | os.PathLike[str] | None = None,
        keep_vae: bool = False,
    ) -> None:
        if mode not in MODES:
            raise InputError(f"unknown merge mode {mode!r}; use {' or '.join(MODES)}")
        if mode == "add-difference" and (b is None or c is None):
            raise InputError("add-difference merges three checkpoints: A + (B - C) * M")
        if mode == "weighted-sum" and c is not None:
            raise InputError("a weighted sum merges two checkpoints (a third, C, is for --mode add-difference)")
        if dtype is not None and dtype not in DTYPES:
            raise InputError(f"unknown output dtype {dtype!r}; use fp16 or fp32")
        if vae is not None and keep_vae:
            raise InputError("give a VAE to bake in or keep A's, not both")
        if not math.isfinite(alpha):
            raise InputError(f"the multiplier M (--alpha) must be a finite number, got {alpha}")
        self.mode, self.alpha, self.dtype, self.keep_vae = mode, float(alpha), dtype, keep_vae
        self.a = _open(a, "checkpoint A")
        self.b = _open(b, "checkpoint B") if b is not None else None
        self.c = _open(c, "checkpoint C") if c is not None else None
        self.vae = _open(vae, "VAE file") if vae is not None else None
        self.vae_keys = self._vae_keys()
        self.plan = self._plan()
        if self.b is not None and not any(item.how == "merge" for item in self.plan):
            raise ModelFormatError(
                f"no tensor of {self.a.path.name} merges with {self.b.path.name}: A1111's merger merges the keys "
                "containing 'model' that both have (LDM/SGM single files: model.diffusion_model.*, ...); "
                "these share none (diffusers-layout files, or two different model families?)"
            )
        self.lora: dict[str, np.ndarray] = {}

    def _vae_keys(self) -> dict[str, TensorEntry]:
        """A's ``first_stage_model.<key>`` -> the VAE file's ``<key>`` (A1111's bake)."""
        if self.vae is None:
            return {}
        found = {VAE_PREFIX + k: e for k, e in self.vae.entries.items() if VAE_PREFIX + k in self.a.entries}
        if not found:
            raise ModelFormatError(
                f"{self.vae.path.name}: none of its tensors is one of A's {VAE_PREFIX}* "
                "(an LDM-layout VAE file is needed)"
            )
        for key, entry in found.items():
            if entry.shape != self.a.entries[key].shape:
                raise ModelFormatError(
                    f"{self.vae.path.name}: {key.removeprefix(VAE_PREFIX)} is {list(entry.shape)}, "
                    f"A's is {list(self.a.entries[key].shape)}"
                )
        return found

    def _out_dtype(self, stored: str, how: str) -> str:
        """fp32: every float tensor; fp16 as A1111's "save as float16": the tensors the merge
        made (merged, B's, the baked VAE's), or every one when there is no B; else A's dtype."""
        if stored not in FLOATS:
            return stored
        if self.dtype == "fp32" or (self.dtype == "fp16" and (self.b is None or how != "copy-a")):
            return DTYPES[self.dtype]
        return stored if stored in ("F16", "F32", "BF16") else "F16"

    def _how(self, key: str, entry: TensorEntry) -> str:
        if key in self.vae_keys:
            return "vae"
        if self.b is None or "model" not in key or key not in self.b.entries or key in SKIP_ON_MERGE:
            return "copy-a"
        if self.keep_vae and key.startswith(VAE_PREFIX):
            return "copy-a"
        if entry.dtype not in FLOATS:
            return "copy-a"
        b_shape = self.b.entries[key].shape
        if b_shape != entry.shape:
            a_shape = entry.shape
            same_rest = len(a_shape) == len(b_shape) == 4 and a_shape[0] == b_shape[0] and a_shape[2:] == b_shape[2:]
            if not (same_rest and a_shape[1] in (8, 9) and b_shape[1] == 4):
                hint = " (an inpainting or instruct-pix2pix model must be A)" if same_rest else ""
                raise ModelFormatError(f"{key}: A is {list(a_shape)}, B is {list(b_shape)}: not mergeable{hint}")
        return "merge"

    def _plan(self) -> list[Planned]:
        plan = []
        for key, entry in self.a.entries.items():
            how = self._how(key, entry)
            plan.append(Planned(key, self._out_dtype(entry.dtype, how), entry.shape, how))
        if self.b is not None:  # A1111 adds the "model" keys of B that A lacks
            for key, entry in self.b.entries.items():
                if "model" in key and key not in self.a.entries and key not in SKIP_ON_MERGE:
                    plan.append(Planned(key, self._out_dtype(entry.dtype, "from-b"), entry.shape, "from-b"))
        return plan

    def bake_loras(
        self, loras: Sequence[tuple[str | os.PathLike[str] | LoraFile, float]], families: Sequence[Family]
    ) -> None:
        """Add LoRAs at their strengths (A's family and layout detected from A's keys)."""
        if not loras:
            return
        checkpoint = Checkpoint.open(self.a.path)
        found = detect(checkpoint, families)
        files = [(lora if isinstance(lora, LoraFile) else open_lora(lora), float(s)) for lora, s in loras]
        for (component, name), delta in lora_deltas(found.family, files).items():
            source = found.family.key_map_entry(component, found.layout, name, delta.shape)
            key = checkpoint.find(source)
            if key is None:
                raise ModelFormatError(f"{self.a.path.name} has no tensor for the LoRA's {component} weight {name}")
            stored = self.a.entries[key].shape
            rows = source.rows or (0, stored[0])
            inner: tuple[int, ...] = (rows[1] - rows[0], *stored[1:])
            change = delta.reshape(inner[::-1] if source.transpose else inner)
            if source.swap_halves:
                half = len(change) // 2
                change = np.concatenate([change[half:], change[:half]])
            if source.transpose:
                change = change.T
            total = self.lora.setdefault(key, np.zeros(stored, np.float32))
            total[rows[0] : rows[1]] += change
        checkpoint.close()

    def _value(self, item: Planned) -> np.ndarray:
        if item.how == "vae":
            assert self.vae is not None
            return self.vae.read(self.vae_keys[item.key], np.float32)
        if item.how == "from-b":
            assert self.b is not None
            value = self.b.read(self.b.entries[item.key], np.float32)
            if self.c is not None and item.key in self.c.entries:
                value -= self.c.read(self.c.entries[item.key], np.float32)
            return value
        entry = self.a.entries[item.key]
        if item.how == "copy-a":
            return self.a.read(entry, np.float32) if entry.dtype in FLOATS else np.array(self.a.raw(entry))
        assert self.b is not None
        a = self.a.read(entry, np.float32)
        b = self.b.read(self.b.entries[item.key], np.float32)
        part = a[:, :4] if a.shape != b.shape else a  # inpainting / pix2pix A: its first 4 channels
        alpha = np.float32(self.alpha)
        if self.mode == "weighted-sum":
            merged = part * (np.float32(1.0) - alpha) + b * alpha
        else:
            assert self.c is not None
            c = self.c.read(self.c.entries[item.key], np.float32) if item.key in self.c.entries else np.zeros_like(b)
            merged = part + (b - c) * alpha
        if part is a:
            return np.asarray(merged, dtype=np.float32)
        a[:, :4] = merged
        return a

    def tensors(self) -> Iterator[tuple[Planned, np.ndarray]]:
        """Each output tensor in order, as the bytes' array (dtype converted, LoRA added)."""
        for item in self.plan:
            value = self._value(item)
            if item.key in self.lora:
                value = value.astype(np.float32) + self.lora[item.key]
            if item.dtype == "BF16":
                value = to_bf16_bits(value)
            elif item.dtype in ("F16", "F32", "F64"):
                value = value.astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[item.dtype])
            yield item, np.ascontiguousarray(value)

    def header(self, metadata: dict[str, str]) -> bytes:
        offset, header = 0, dict[str, Any]({"__metadata__": metadata})
        for item in self.plan:
            header[item.key] = {
                "dtype": item.dtype,
                "shape": list(item.shape),
                "data_offsets": [offset, offset + item.nbytes],
            }
            offset += item.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        return text + b" " * (-len(text) % _ALIGN)

    def recipe(self) -> dict[str, str]:
        names = {k: v.path.name for k, v in (("a", self.a), ("b", self.b), ("c", self.c), ("vae", self.vae)) if v}
        recipe = {"mode": self.mode, "alpha": self.alpha, "dtype": self.dtype or "as A", **names}
        if self.keep_vae:
            recipe["vae"] = "A's"
        return {"format": "pt", "sdkit_merge_recipe": json.dumps(recipe)}

    def write(self, output: str | os.PathLike[str]) -> MergeReport:
        output = Path(output)
        inputs = [f.path.resolve() for f in (self.a, self.b, self.c, self.vae) if f is not None]
        if output.resolve() in inputs:
            raise InputError(f"{output} is one of the inputs: write the merge to another file")
        report = MergeReport(output)
        for item in self.plan:
            report.counts[item.how] = report.counts.get(item.how, 0) + 1
        report.lora_keys = len(self.lora)
        header = self.header(self.recipe())
        partial = output.with_name(output.name + ".partial")
        try:
            with partial.open("wb") as f:
                f.write(struct.pack("<Q", len(header)) + header)
                for item, array in self.tensors():
                    if array.nbytes != item.nbytes:
                        raise ModelFormatError(f"{item.key}: {array.nbytes} bytes computed, {item.nbytes} planned")
                    f.write(array.data)
            partial.replace(output)
        except OSError as exc:  # a missing folder, no permission, a full disk
            partial.unlink(missing_ok=True)
            raise InputError(f"cannot write {output}: {exc.strerror or exc}") from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        report.bytes_written = output.stat().st_size
        return report

    def close(self) -> None:
        for file in (self.a, self.b, self.c, self.vae):
            if file is not None:
                file.close()


def merge_checkpoints(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str] | None = None,
    c: str | os.PathLike[str] | None = None,
    *,
    output: str | os.PathLike[str],
    mode: str = "weighted-sum",
    alpha: float = 0.5,
    dtype: str | None = None,
    vae: str | os.PathLike[str] | None = None,
    keep_vae: bool = False,
    loras: Sequence[tuple[str | os.PathLike[str], float]] = (),
    families: Sequence[Family] = (),
) -> MergeReport:
    """Merge as A1111 (module docstring) and write ``output`` (a single ``.safetensors``)."""
    if b is None and vae is None and not loras:
        raise InputError("nothing to merge: give B (and C), a VAE to bake in or a LoRA")
    merger = Merger(a, b, c, mode=mode, alpha=alpha, dtype=dtype, vae=vae, keep_vae=keep_vae)
    try:
        merger.bake_loras(loras, families)
        return merger.write(output)
    finally:
        merger.close()


def parse_lora(text: str) -> tuple[str, float]:
    """``FILE[:STRENGTH]`` (default 1) -> (file, strength)."""
    path, sep, strength = text.rpartition(":")
    if not sep or not path:
        return text, 1.0
    try:
        return path, float(strength)
    except ValueError:
        return text, 1.0
