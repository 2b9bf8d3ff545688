"""The CLIP tokenizer of a pipeline: a diffusers folder's tokenizer files, or the CLIP vocabulary
sdkit ships (single-file checkpoints carry none); both built on the ``tokenizers`` library.

CLIP's tokenizer is byte-level BPE with a ``</w>`` end-of-word suffix, lower-cased text with runs
of whitespace collapsed, and a start and an end token around every prompt. ``ClipTokenizer``
configures those pieces from a ``tokenizer/`` folder (``vocab.json`` + ``merges.txt``, or a
``tokenizer.json``); the windowing (77 tokens: start, 75, end, padding; longer prompts truncated
with a ``PromptTruncatedWarning``) is ``sdkit.families.clip_tokenizer.ClipTokenizerBase``'s.
``make_tokenizer(source)`` makes the tokenizer a ``PipelineConfig.tokenizers`` entry names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.families.clip_tokenizer import (
    ClipTokenizerBase,
    PromptTruncatedWarning,
    ShippedVocab,
    TokenizerSource,
    configure_clip,
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
        from tokenizers import Tokenizer

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
            self._tokenizer = self._from_vocab(vocab_file, merges_file, unk_token)
        elif (folder / "tokenizer.json").is_file():
            try:
                self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as exc:  # tokenizers raises plain Exceptions on bad files
                raise ModelFormatError(f"{folder / 'tokenizer.json'} cannot be read: {exc}") from None
            self._tokenizer.post_processor = None
        else:
            raise ModelFormatError(f"tokenizer folder {folder} has neither vocab.json + merges.txt nor tokenizer.json")
        self._finish()

    @staticmethod
    def _from_vocab(vocab_file: Path, merges_file: Path, unk_token: str) -> Any:
        from tokenizers import Tokenizer
        from tokenizers.models import BPE

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
        try:
            model = BPE(
                vocab=vocab,
                merges=merges,
                continuing_subword_prefix="",
                end_of_word_suffix="</w>",
                fuse_unk=False,
                unk_token=unk_token,
            )
        except Exception as exc:
            raise ModelFormatError(f"tokenizer files in {vocab_file.parent} are inconsistent: {exc}") from None
        return configure_clip(Tokenizer(model))


def make_tokenizer(source: TokenizerSource) -> ClipTokenizerBase:
    """The tokenizer a ``PipelineConfig.tokenizers`` entry names: a folder, or the shipped
    vocabulary (``ShippedVocab``) for single-file checkpoints."""
    if isinstance(source, ShippedVocab):
        return source.tokenizer()
    return ClipTokenizer(source)
