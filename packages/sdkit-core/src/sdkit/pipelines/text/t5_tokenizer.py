"""The T5 tokenizer of SD3 (``tokenizer_3``), Flux.1 and Chroma (``tokenizer_2``): SentencePiece
Unigram in plain Python (``sdkit.pipelines.text.unigram``: token for token what the ``tokenizers``
library computes, without it).

T5's SentencePiece model (32,000 pieces plus 100 ``<extra_id_*>`` sentinels; ``<pad>`` 0, ``</s>``
1, ``<unk>`` 2) is read from a pipeline's tokenizer folder when it has a ``tokenizer.json`` (what
diffusers folders carry), else from the copy shipped with sdkit (``t5_vocab/``, Apache-2.0, see
its ``PROVENANCE.md``): single-file checkpoints carry no tokenizer. A folder with only
``spiece.model`` is accepted when it is that same model (sha256 checked); reading another one
would need the ``sentencepiece`` package, which sdkit does not use.

Encoding is diffusers' (``_get_t5_prompt_embeds`` of the SD3, Flux and Chroma pipelines):
``tokenizer(prompt, padding="max_length", max_length=max_sequence_length, truncation=True)``: the
prompt's pieces, ``</s>``, then ``<pad>`` up to ``max_sequence_length`` (SD3: 256, Flux and
Chroma: 512). A longer prompt keeps its first ``max_sequence_length - 1`` pieces and its ``</s>``,
with a ``PromptTruncatedWarning`` naming what was cut (diffusers logs the same warning).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.text.clip_tokenizer import PromptTruncatedWarning
from sdkit.pipelines.text.unigram import Unigram

SHIPPED = Path(__file__).with_name("t5_vocab") / "tokenizer.json.gz"
# sha256 of T5's spiece.model (google/t5-v1_1-xxl, FLUX.1 tokenizer_2, SD3 tokenizer_3), the model
# the shipped tokenizer.json was converted from.
SPIECE_SHA256 = "d60acb128cf7b7f2536e8f38a5b18a05535c9e14c7a355904270e15b0945ea86"
MAX_SEQUENCE_LENGTH = 512  # T5's position range (relative buckets allow more; diffusers caps at 512)


@dataclass(frozen=True)
class T5Tokens:
    """A batch of encoded prompts: ``input_ids`` [B, L] int64 and ``attention_mask`` [B, L] int64
    (1 for the pieces and ``</s>``, 0 for padding; Chroma's pipeline reads it)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray


@lru_cache(maxsize=1)
def _shipped_json() -> str:
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as handle:
        return handle.read()


@lru_cache(maxsize=1)
def _shipped() -> Unigram:
    return Unigram(json.loads(_shipped_json()))


def _load(folder: Path | None) -> Unigram:
    if folder is None:
        return _shipped()
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelFormatError(f"{path} cannot be read: {exc}") from None
        if not isinstance(spec, dict):
            raise ModelFormatError(f"{path} is not a tokenizer description")
        return Unigram(spec)
    spiece = folder / "spiece.model"
    if spiece.is_file():
        if hashlib.sha256(spiece.read_bytes()).hexdigest() == SPIECE_SHA256:
            return _shipped()
        raise ModelFormatError(
            f"{spiece} is not T5's SentencePiece model and the folder has no tokenizer.json; "
            "add the tokenizer.json of the model (transformers' T5TokenizerFast writes it)"
        )
    raise ModelFormatError(f"T5 tokenizer folder {folder} has neither tokenizer.json nor spiece.model")


class T5Tokenizer:
    """Prompt text -> T5 token ids, as diffusers' SD3/Flux/Chroma pipelines tokenize for T5.

    ``T5Tokenizer()`` uses the shipped vocabulary; ``T5Tokenizer(folder)`` a pipeline's
    ``tokenizer_2`` / ``tokenizer_3`` folder.
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = None if folder is None else Path(folder)
        # The pieces alone: </s> and padding are added below, as the model's template does.
        self._tokenizer = _load(self.folder)
        self.pad_id = self._id("<pad>")
        self.eos_id = self._id("</s>")
        self.unk_id = self._id("<unk>")

    def _id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ModelFormatError(f"the T5 tokenizer's vocabulary lacks {token!r}")
        return int(token_id)

    @property
    def vocab_size(self) -> int:
        """Pieces including the sentinels and special tokens (32,100 for T5)."""
        return self._tokenizer.vocab_size()

    def tokens(self, prompt: str) -> list[int]:
        """The prompt's piece ids, without ``</s>``, padding or truncation."""
        return self._tokenizer.encode(prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids)

    def __call__(self, prompts: str | Sequence[str], max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> T5Tokens:
        """``max_sequence_length`` ids per prompt: pieces, ``</s>``, ``<pad>`` padding."""
        if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, int):
            raise InputError(f"max_sequence_length must be an integer, got {max_sequence_length!r}")
        if not 2 <= max_sequence_length <= MAX_SEQUENCE_LENGTH:
            raise InputError(f"max_sequence_length must be in 2..{MAX_SEQUENCE_LENGTH}, got {max_sequence_length}")
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        room = max_sequence_length - 1
        ids = np.full((len(texts), max_sequence_length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), max_sequence_length), dtype=np.int64)
        for row, text in enumerate(texts):
            pieces = self.tokens(text)
            if len(pieces) > room:
                warnings.warn(
                    f"the prompt is {len(pieces)} T5 tokens long; the text encoder reads {room}, "
                    f"so this part is ignored: {self.decode(pieces[room:])!r}",
                    PromptTruncatedWarning,
                    stacklevel=2,
                )
                pieces = pieces[:room]
            window = [*pieces, self.eos_id]
            ids[row, : len(window)] = window
            mask[row, : len(window)] = 1
        return T5Tokens(ids, mask)
