"""A LoRA ``.safetensors`` file read into modules: each a low-rank pair (down, up), its alpha,
and the module name as the file spells it.

The formats users have (key facts in ``fixtures/families/README.md``, "LoRA"):

- kohya / sd-scripts (A1111, ComfyUI, civitai): ``<module>.lora_down.weight``,
  ``<module>.lora_up.weight``, ``<module>.alpha``, ``<module>`` = ``lora_unet_`` /
  ``lora_te_`` / ``lora_te1_`` / ``lora_te2_`` + the module path with ``.`` -> ``_``; LoCon
  (3x3 convs) in the same keys;
- PEFT / diffusers >= 0.24: ``<component>.<module>.lora_A.weight`` / ``.lora_B.weight``, the
  scale in the ``lora_adapter_metadata`` JSON (``<component>.lora_alpha`` / ``.r``, per-module
  ``alpha_pattern``), ``lora_alpha = r`` without it;
- older diffusers: ``<module>.lora.down.weight`` / ``.lora.up.weight``,
  ``<module>.lora_linear_layer.down/up.weight``, ``<attention>.processor.to_q_lora.down.weight``.

Only the header is read here; tensors come from the memory map when a merge asks for them.
LyCORIS LoHa (``hada_w1_a`` ...) and LoKr (``lokr_w1``, ``lokr_w2_a`` ...) modules under kohya
names are read too; their Tucker variants (``hada_t1``, ``lokr_t2``), DoRA and other LyCORIS
kinds are refused with a clear message.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families.checkpoint import Checkpoint

KOHYA_PREFIXES = ("lora_unet_", "lora_te1_", "lora_te2_", "lora_te_")
_KOHYA = re.compile(r"^(lora_(?:unet|te\d?)_\w+)\.(lora_down\.weight|lora_up\.weight|alpha)$")
_PEFT = re.compile(r"^(.+)\.(lora_A|lora_B)(?:\.default)?\.weight$")
_OLD_DIFFUSERS = re.compile(r"^(.+)\.(?:lora|lora_linear_layer)\.(down|up)\.weight$")
_PROCESSOR = re.compile(r"^(.+)\.processor\.(to_q|to_k|to_v|to_out)_lora\.(down|up)\.weight$")
_ALPHA = re.compile(r"^(.+)\.alpha$")
_LYCORIS = re.compile(r"^(lora_(?:unet|te\d?)_\w+)\.(hada_w[12]_[ab]|lokr_w[12](?:_[ab])?)$")
_REFUSED = re.compile(r"\.(hada_t[12]|lokr_t[12]|dora_scale|diff|diff_b|oft_\w+|oft_blocks)$")
PART = {
    "lora_down.weight": "down",
    "lora_up.weight": "up",
    "lora_A": "down",
    "lora_B": "up",
    "down": "down",
    "up": "up",
}


@dataclass
class LoraModule:
    """One adapted layer: the keys of its factors and its alpha (``None``: the file's default
    scale applies). ``kind``: ``lora`` (``down`` ``[r, in(, kh, kw)]``, ``up`` ``[out, r(, 1, 1)]``),
    ``loha`` (LyCORIS LoHa: ``w1_a``, ``w1_b``, ``w2_a``, ``w2_b``) or ``lokr`` (LyCORIS LoKr:
    ``w1`` or ``w1_a`` + ``w1_b``, ``w2`` or ``w2_a`` + ``w2_b``)."""

    name: str  # as the file spells it: lora_unet_down_blocks_0_..., unet.down_blocks.0....
    kind: str = "lora"
    parts: dict[str, str] = field(default_factory=dict)  # factor -> key
    alpha: float | None = None

    @property
    def down(self) -> str:
        return self.parts.get("down", "")

    @property
    def up(self) -> str:
        return self.parts.get("up", "")

    @property
    def complete(self) -> bool:
        have = set(self.parts)
        if self.kind == "loha":
            return have == {"w1_a", "w1_b", "w2_a", "w2_b"}
        if self.kind == "lokr":
            return all(f"w{i}" in have or {f"w{i}_a", f"w{i}_b"} <= have for i in (1, 2))
        return have == {"down", "up"}

    def rank_key(self) -> str | None:
        """The factor whose first axis is the rank (none for a LoKr of full matrices)."""
        if self.kind == "lora":
            return self.down
        if self.kind == "loha":
            return self.parts["w1_b"]
        return self.parts.get("w1_b") or self.parts.get("w2_b")


@dataclass
class LoraFile:
    """A LoRA file's modules (header only) and how to scale them."""

    path: Path
    checkpoint: Checkpoint
    format: str  # "kohya", "peft", "diffusers"
    modules: dict[str, LoraModule]
    unknown: list[str] = field(default_factory=list)  # keys that are no LoRA part
    peft_config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    def is_locon(self) -> bool:
        """Whether it adapts 3x3 convs too (LoCon)."""
        return any(self.checkpoint.entry(m.down).shape[2:] not in ((), (1, 1)) for m in self.modules.values() if m.down)

    def kinds(self) -> list[str]:
        return sorted({m.kind for m in self.modules.values()})

    def alphas(self) -> list[float]:
        return sorted({m.alpha for m in self.modules.values() if m.alpha is not None})

    def rank(self, module: LoraModule) -> int | None:
        key = module.rank_key()
        return int(self.checkpoint.entry(key).shape[0]) if key else None

    def ranks(self) -> list[int]:
        return sorted({r for m in self.modules.values() if (r := self.rank(m)) is not None})

    def tensor(self, key: str) -> np.ndarray:
        """A tensor of the file in float32 (read from the memory map)."""
        entry = self.checkpoint.entry(key)
        return self.checkpoint.files[0].read(entry, np.float32)

    def scale(self, module: LoraModule) -> float:
        """``alpha / rank``: kohya's per-module ``alpha``, PEFT's ``lora_alpha`` (or its
        ``alpha_pattern`` entry) from the metadata, else 1 (``alpha = rank``, as diffusers). A
        LoKr of two full matrices has no rank: 1 (LyCORIS and ComfyUI ignore its alpha)."""
        rank = self.rank(module)
        if rank is None:
            return 1.0
        if module.alpha is not None:
            return module.alpha / rank
        component, _, path = module.name.partition(".")
        config = self.peft_config
        pattern = config.get(f"{component}.alpha_pattern") or {}
        for key, value in pattern.items() if isinstance(pattern, dict) else ():
            if path == key or path.endswith("." + key):
                return float(value) / rank
        alpha = config.get(f"{component}.lora_alpha")
        return float(alpha) / rank if isinstance(alpha, int | float) else 1.0


def _alpha(checkpoint: Checkpoint, key: str) -> float:
    entry = checkpoint.entry(key)
    if entry.size != 1:
        raise ModelFormatError(f"{checkpoint.path.name}: {key} should be one number, it has shape {list(entry.shape)}")
    return float(checkpoint.files[0].read(entry, np.float64).reshape(-1)[0])


def _classify(key: str) -> tuple[str, str, str, str] | None:
    """(format, module name, kind, part) of a LoRA key, or None."""
    match = _KOHYA.match(key)
    if match:
        part = match.group(2)
        return "kohya", match.group(1), "lora", PART.get(part, part)
    match = _LYCORIS.match(key)
    if match:
        kind, _, part = match.group(2).partition("_")
        return "kohya", match.group(1), {"hada": "loha", "lokr": "lokr"}[kind], part
    match = _PROCESSOR.match(key)
    if match:
        attention = "to_out.0" if match.group(2) == "to_out" else match.group(2)
        return "diffusers", f"{match.group(1)}.{attention}", "lora", match.group(3)
    match = _PEFT.match(key)
    if match:
        return "peft", match.group(1), "lora", PART[match.group(2)]
    match = _OLD_DIFFUSERS.match(key)
    if match:
        return "diffusers", match.group(1), "lora", match.group(2)
    match = _ALPHA.match(key)
    if match:
        return "diffusers", match.group(1), "", "alpha"
    return None


def _peft_config(checkpoint: Checkpoint) -> dict[str, Any]:
    text = checkpoint.metadata.get("lora_adapter_metadata")
    if not text:
        return {}
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):
        raise ModelFormatError(f"{checkpoint.path.name}: its lora_adapter_metadata is not JSON") from None
    return config if isinstance(config, dict) else {}


def open_lora(path: str | os.PathLike[str]) -> LoraFile:
    """Read a LoRA file's header: its modules, format and scale; one ``ModelFormatError`` for a
    pickle, a truncated or lying file, a LyCORIS kind not merged, or a file with no LoRA module."""
    return read_lora(Checkpoint.open(path))


def read_lora(checkpoint: Checkpoint) -> LoraFile:
    """``open_lora`` on an opened file."""
    name = checkpoint.path.name
    if checkpoint.is_folder:
        raise ModelFormatError(f"{name} is a folder; a LoRA is one .safetensors file")
    refused = sorted({m.group(1).split("_")[0] for k in checkpoint if (m := _REFUSED.search(k))})
    if refused:
        kinds = {"hada": "LoHa with Tucker", "lokr": "LoKr with Tucker", "dora": "DoRA", "diff": "full-weight diff"}
        named = ", ".join(kinds.get(k, k.upper()) for k in refused)
        raise ModelFormatError(
            f"{name} is a LyCORIS file of a kind sdkit does not merge ({named}); LoRA, LoCon, LoHa and LoKr are"
        )
    modules: dict[str, LoraModule] = {}
    unknown: list[str] = []
    formats: set[str] = set()
    for key in checkpoint:
        found = _classify(key)
        if found is None:
            unknown.append(key)
            continue
        fmt, module_name, kind, part = found
        module = modules.setdefault(module_name, LoraModule(module_name))
        if part == "alpha":
            module.alpha = _alpha(checkpoint, key)
            continue
        formats.add(fmt)
        module.kind = kind
        module.parts[part] = key
    incomplete = [m.name for m in modules.values() if not m.complete]
    unknown.extend(sorted(incomplete))
    modules = {n: m for n, m in modules.items() if m.complete}
    if not modules:
        shown = ", ".join(checkpoint.keys()[:3])
        raise ModelFormatError(
            f"{name} is not a LoRA: no <module>.lora_down/lora_up (kohya) or lora_A/lora_B (PEFT) pairs "
            f"among its {len(checkpoint)} tensors ({shown}...)"
        )
    fmt = "kohya" if "kohya" in formats else "peft" if "peft" in formats else "diffusers"
    return LoraFile(checkpoint.path, checkpoint, fmt, modules, unknown, _peft_config(checkpoint))
