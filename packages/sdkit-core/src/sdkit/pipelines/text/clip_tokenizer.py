"""The CLIP tokenizer of a pipeline: a diffusers folder's tokenizer files, or the CLIP vocabulary
sdkit ships (single-file checkpoints carry none); both on ``sdkit.families.bpe.ClipBPE``.

CLIP's tokenizer is byte-level BPE with a ``</w>`` end-of-word suffix, lower-cased text with runs
of whitespace collapsed, and a start and an end token around every prompt. ``ClipTokenizer``
configures those pieces from a ``tokenizer/`` folder (``vocab.json`` + ``merges.txt``, or a
``tokenizer.json``: its BPE vocabulary and merges, read with CLIP's normaliser and pre-tokeniser);
the windowing (77 tokens: start, 75, end, padding; longer prompts truncated
with a ``PromptTruncatedWarning``) is ``sdkit.families.clip_tokenizer.ClipTokenizerBase``'s.
``make_tokenizer(source)`` makes the tokenizer a ``PipelineConfig.tokenizers`` entry names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.families.bpe import ClipBPE
from sdkit.families.clip_tokenizer import (
    ClipTokenizerBase,
    PromptTruncatedWarning,
    ShippedVocab,
    TokenizerSource,
)
from sdkit.files import read_optional_json_object

__all__ = [
    "ClipTokenizer",
    "ClipTokenizerBase",
    "PromptTruncatedWarning",
    "ShippedVocab",
    "TokenizerSource",
    "make_tokenizer",
]


def _token_text(value: Any) -> str | None:
    """A special token from a tokenizer config: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class ClipTokenizer(ClipTokenizerBase):
    """The CLIP tokenizer of a diffusers pipeline's ``tokenizer/`` folder."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        config = {
            **read_optional_json_object(folder / "special_tokens_map.json", "tokenizer file"),
            **read_optional_json_object(folder / "tokenizer_config.json", "tokenizer file"),
        }
        self.bos_token = _token_text(config.get("bos_token")) or "<|startoftext|>"
        self.eos_token = _token_text(config.get("eos_token")) or "<|endoftext|>"
        unk_token = _token_text(config.get("unk_token")) or self.eos_token
        # SD 1.x pads with the end token, SD 2.x with "!": the folder says which.
        self.pad_token = _token_text(config.get("pad_token")) or self.eos_token
        max_length = config.get("model_max_length", 77)
        # Some configs store "infinite" (1e30) here: CLIP's window is 77 then.
        self.model_max_length = int(max_length) if isinstance(max_length, int) and 2 < max_length <= 4096 else 77

        vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
        if vocab_file.is_file() and merges_file.is_file():
            vocab, merges = self._read_vocab(vocab_file, merges_file)
        elif (folder / "tokenizer.json").is_file():
            vocab, merges, unk_token = self._read_tokenizer_json(folder / "tokenizer.json", unk_token)
        else:
            raise ModelFormatError(f"tokenizer folder {folder} has neither vocab.json + merges.txt nor tokenizer.json")
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in vocab.items()):
            raise ModelFormatError(f"the tokenizer vocabulary in {folder} is not a token -> id mapping")
        self._tokenizer = ClipBPE(vocab, merges, unk_token)
        self._finish()

    @staticmethod
    def _read_vocab(vocab_file: Path, merges_file: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
        try:
            vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
            lines = merges_file.read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise ModelFormatError(f"tokenizer files in {vocab_file.parent} cannot be read: {exc}") from None
        if not isinstance(vocab, dict):
            raise ModelFormatError(f"{vocab_file} is not a token -> id mapping")
        merges = []
        for line in lines:
            if not line or line.startswith("#version"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ModelFormatError(f"{merges_file}: bad merge line {line!r}")
            merges.append((parts[0], parts[1]))
        return vocab, merges

    @staticmethod
    def _read_tokenizer_json(path: Path, unk_token: str) -> tuple[dict[str, int], list[tuple[str, str]], str]:
        """A ``tokenizer.json``'s BPE vocabulary, merges (``"a b"`` strings or ``[a, b]`` pairs)
        and unknown token; the file's normaliser and pre-tokeniser are CLIP's by definition here."""
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelFormatError(f"{path} cannot be read: {exc}") from None
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
            raise ModelFormatError(f"{path} is not a BPE tokenizer (CLIP's tokenizers are)")
        vocab, raw_merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(raw_merges, list):
            raise ModelFormatError(f"{path} has no BPE vocabulary and merges")
        merges = []
        for entry in raw_merges:
            parts = entry.split() if isinstance(entry, str) else entry
            if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise ModelFormatError(f"{path}: bad merge {entry!r}")
            merges.append((parts[0], parts[1]))
        if model.get("end_of_word_suffix", "</w>") != "</w>":
            raise ModelFormatError(f"{path} is not a CLIP tokenizer (its BPE has no </w> word ends)")
        unk = model.get("unk_token")
        return vocab, merges, unk if isinstance(unk, str) else unk_token


def make_tokenizer(source: TokenizerSource) -> ClipTokenizerBase:
    """The tokenizer a ``PipelineConfig.tokenizers`` entry names: a folder, or the shipped
    vocabulary (``ShippedVocab``) for single-file checkpoints."""
    if isinstance(source, ShippedVocab):
        return source.tokenizer()
    return ClipTokenizer(source)
