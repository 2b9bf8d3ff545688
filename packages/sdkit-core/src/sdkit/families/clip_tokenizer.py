"""CLIP's BPE vocabulary, shipped with sdkit, as the tokenizer of single-file checkpoints.

A civitai ``.safetensors`` checkpoint carries no tokenizer, yet every SD family's text encoders
(CLIP-L, OpenCLIP-H, OpenCLIP-bigG) use the one vocabulary OpenAI published with CLIP:
``bpe_simple_vocab_16e6.txt.gz`` (MIT; the copy in ``clip_vocab/`` beside this module comes from a PyPI wheel, see
its PROVENANCE.md). The token ids are built as CLIP's own ``SimpleTokenizer`` and SD's
``CLIPTokenizer`` (``vocab.json``) number them:

- ids 0-255: the 256 byte-level symbols (GPT-2's bytes-to-unicode table) in that table's order;
- ids 256-511: the same symbols with the end-of-word suffix ``</w>``;
- then one token per merge, the pair joined, for the first 48,894 merges of the file;
- ``<|startoftext|>`` (49406) and ``<|endoftext|>`` (49407): 49,408 tokens in all.

The BPE itself is ``sdkit.families.bpe.ClipBPE``: CLIP's normaliser, pre-tokeniser, byte-level
alphabet and ``</w>`` suffix in plain Python, token for token what the ``tokenizers`` library
computes (sdkit does not depend on that library: it and the Hub client it requires would add 41 MB).
``ClipTokenizerBase`` turns prompts into the text encoder's
fixed-length windows; ``sdkit.pipelines.text.clip_tokenizer.ClipTokenizer`` is the same on a diffusers
folder's tokenizer files, and ``make_tokenizer`` there picks one from a ``PipelineConfig``.

Prompts are encoded into one window of ``model_max_length`` tokens (77 for SD): start token, up
to 75 prompt tokens, end token, then padding. Longer prompts are truncated like diffusers does,
with a ``warnings.warn`` (category ``PromptTruncatedWarning``) naming what was cut.
"""

from __future__ import annotations

import gzip
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families.bpe import ClipBPE, bytes_to_unicode

VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
VOCAB_SIZE = 49408
MERGES = VOCAB_SIZE - 2 * 256 - 2  # 48,894: CLIP reads lines 1 .. 49152-256-2 of the file
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
# A1111's extra-network tags (<lora:name:0.8>, <lyco:...>, <hypernet:...>): they choose networks
# and are no text for the encoder; A1111 removes them from the prompt it encodes, as here.
EXTRA_NETWORK_TAG = re.compile(r"<(?:lora|lyco|hypernet):[^<>]*>", re.IGNORECASE)


def _byte_symbols() -> list[str]:
    # The id order is the table's insertion order: printable bytes first, then the rest.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = bytes_to_unicode()
    return [table[b] for b in printable] + [table[b] for b in range(256) if b not in printable]


@lru_cache(maxsize=1)
def vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's ``vocab.json`` mapping and merge list, read from the shipped vocabulary file."""
    data = resources.files("sdkit.families").joinpath("clip_vocab").joinpath(VOCAB_FILE).read_bytes()
    lines = gzip.decompress(data).decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : MERGES + 1]]
    symbols = _byte_symbols()
    tokens = [*symbols, *(s + "</w>" for s in symbols), *("".join(m) for m in merges), BOS, EOS]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != VOCAB_SIZE or any(len(m) != 2 for m in merges):
        raise RuntimeError(f"the shipped CLIP vocabulary is damaged ({len(vocab)} tokens)")
    return vocab, [(a, b) for a, b in merges]


class PromptTruncatedWarning(UserWarning):
    """A prompt had more tokens than the text encoder's window; the rest was dropped."""


def clip_bpe() -> ClipBPE:
    """CLIP's BPE on the shipped vocabulary: SD's CLIPTokenizer ids (no special tokens added)."""
    vocab, merges = vocab_and_merges()
    return ClipBPE(vocab, merges, unk_token=EOS)


class ClipTokenizerBase:
    """Prompt text -> fixed-length token-id windows for a CLIP text encoder.

    A subclass sets ``bos_token``, ``eos_token``, ``pad_token``, ``model_max_length`` and
    ``_tokenizer`` (a ``ClipBPE``), then calls ``_finish()``.
    """

    bos_token: str
    eos_token: str
    pad_token: str
    model_max_length: int
    _tokenizer: ClipBPE

    def _finish(self) -> None:
        self._expand: dict[int, list[int]] = {}  # an embedding's first token -> all its tokens
        self._add_specials()
        self.bos_id = self._id(self.bos_token)
        self.eos_id = self._id(self.eos_token)
        self.pad_id = self._id(self.pad_token)

    def _add_specials(self) -> None:
        # transformers' CLIPTokenizer registers every special token, the pad token "!" of SD 2.x
        # and SDXL's bigG included, as an added token that splits the text: "wow!!" is then
        # "wow", "!", "!" (ids 0, 0), not the merged "!!" token (committed golden:
        # fixtures/families/clip_vocab_golden.json). Written into a prompt, "<|endoftext|>" is its id.
        self._tokenizer.add_special_tokens(sorted({self.bos_token, self.eos_token, self.pad_token}))

    def _id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ModelFormatError(f"the tokenizer's vocabulary lacks the special token {token!r}")
        return int(token_id)

    def __len__(self) -> int:
        """The vocabulary size with added tokens (transformers' ``len(tokenizer)``)."""
        return self._tokenizer.vocab_size()

    def add_embedding(self, name: str, vectors: int) -> list[int]:
        """Register a textual-inversion embedding as diffusers' ``load_textual_inversion`` does:
        the tokens ``name``, ``name_1``, ... ``name_{vectors-1}`` with the next free ids; ``name``
        in a prompt then stands for all of them. Returns their ids (the same ones again when
        ``name`` is already registered with that many vectors)."""
        tokens = [name.lower()] + [f"{name.lower()}_{i}" for i in range(1, vectors)]
        known = [self._tokenizer.token_to_id(t) for t in tokens]
        if known[0] is not None and self._expand.get(known[0]) == known:
            return [i for i in known if i is not None]
        if any(i is not None for i in known):
            raise ModelFormatError(f"the embedding name {name!r} is already a token of the vocabulary; rename its file")
        self._tokenizer.add_tokens(tokens)
        ids = [self._id(t) for t in tokens]
        self._expand[ids[0]] = ids
        return ids

    def tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids, without start/end tokens or truncation (A1111's
        ``<lora:...>`` tags removed, each embedding's trigger expanded to its tokens)."""
        text = EXTRA_NETWORK_TAG.sub("", prompt)
        ids = self._tokenizer.encode(text.strip())
        if not self._expand:
            return ids
        return [t for i in ids for t in self._expand.get(i, [i])]

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


class ShippedClipTokenizer(ClipTokenizerBase):
    """The CLIP tokenizer on the shipped vocabulary, for checkpoints that carry no tokenizer.

    ``pad_token`` is ``<|endoftext|>`` for SD 1.x and SDXL's first encoder, ``"!"`` for SD 2.x
    and SDXL's OpenCLIP-bigG encoder (what their diffusers ``tokenizer_config.json`` say).
    """

    def __init__(self, pad_token: str = EOS, model_max_length: int = 77) -> None:
        self.bos_token, self.eos_token, self.pad_token = BOS, EOS, pad_token
        self.model_max_length = model_max_length
        self._tokenizer = clip_bpe()
        self._finish()


@dataclass(frozen=True)
class ShippedVocab:
    """A tokenizer source (``PipelineConfig.tokenizers``): the shipped CLIP vocabulary with this
    padding token (``<|endoftext|>`` for CLIP-L, ``"!"`` for OpenCLIP) and window length."""

    pad_token: str = EOS
    model_max_length: int = 77

    def tokenizer(self) -> ShippedClipTokenizer:
        return ShippedClipTokenizer(self.pad_token, self.model_max_length)


# The two shipped vocabularies every family names (SD 1.x/2.x, SDXL, SD3, Flux, Chroma).
CLIP_VOCAB = ShippedVocab(EOS)  # CLIP-L pads with its end token
OPENCLIP_VOCAB = ShippedVocab("!")  # OpenCLIP pads with "!" (id 0)

TokenizerSource = Path | ShippedVocab
"""Where a text encoder's tokenizer comes from: a tokenizer folder, or the shipped vocabulary."""
