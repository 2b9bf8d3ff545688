"""The CLIP tokenizer of a diffusers pipeline, built on the ``tokenizers`` library.

CLIP's tokenizer is byte-level BPE with a ``</w>`` end-of-word suffix, lower-cased text with runs
of whitespace collapsed, and a start and an end token around every prompt. The pieces below are
configured from the pipeline's ``tokenizer/`` folder (``vocab.json`` + ``merges.txt``, or a
``tokenizer.json``); the BPE itself is the ``tokenizers`` library's, never hand-written.

Prompts are encoded into one window of ``model_max_length`` tokens (77 for SD 1.x/2.x): start
token, up to 75 prompt tokens, end token, then padding. Longer prompts are truncated like
diffusers does, with a ``warnings.warn`` (category ``PromptTruncatedWarning``) naming what was cut.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.pipelines.layout import read_optional_json_object

# CLIP's pre-tokenizer: contractions, letter runs, single digits, punctuation runs.
_CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


class PromptTruncatedWarning(UserWarning):
    """A prompt had more tokens than the text encoder's window; the rest was dropped."""


def _token_text(value: Any) -> str | None:
    """A special token from a tokenizer config: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class ClipTokenizer:
    """Prompt text -> fixed-length token-id windows for a CLIP text encoder."""

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
        self._add_specials()
        self.bos_id = self._id(self.bos_token)
        self.eos_id = self._id(self.eos_token)
        self.pad_id = self._id(self.pad_token)

    @staticmethod
    def _from_vocab(vocab_file: Path, merges_file: Path, unk_token: str) -> Any:
        from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import BPE

        try:
            vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
            lines = merges_file.read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError) as exc:
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
            tokenizer = Tokenizer(
                BPE(
                    vocab=vocab,
                    merges=merges,
                    continuing_subword_prefix="",
                    end_of_word_suffix="</w>",
                    fuse_unk=False,
                    unk_token=unk_token,
                )
            )
        except Exception as exc:
            raise ModelFormatError(f"tokenizer files in {vocab_file.parent} are inconsistent: {exc}") from None
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer

    def _add_specials(self) -> None:
        # Written into a prompt, the special tokens map to their ids, as in transformers.
        from tokenizers import AddedToken

        specials = {self.bos_token, self.eos_token, self.pad_token} - {None}
        self._tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in sorted(specials) if t.startswith("<|")]
        )

    def _id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ModelFormatError(f"the tokenizer's vocabulary lacks the special token {token!r}")
        return int(token_id)

    def tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids, without start/end tokens or truncation."""
        encoding = self._tokenizer.encode(prompt.strip(), add_special_tokens=False)
        return list(encoding.ids)

    def __call__(self, prompts: str | Sequence[str]) -> np.ndarray:
        """``[len(prompts), model_max_length]`` int64 ids: start, prompt, end, padding."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        room = self.model_max_length - 2
        rows = np.full((len(texts), self.model_max_length), self.pad_id, dtype=np.int64)
        for row, text in enumerate(texts):
            ids = self.tokens(text)
            if len(ids) > room:
                dropped = self._tokenizer.decode(ids[room:]).replace("</w>", " ").strip()
                warnings.warn(
                    f"the prompt is {len(ids)} tokens long; the text encoder reads {room}, "
                    f"so this part is ignored: {dropped!r}",
                    PromptTruncatedWarning,
                    stacklevel=3,
                )
                ids = ids[:room]
            window = [self.bos_id, *ids, self.eos_id]
            rows[row, : len(window)] = window
        return rows
