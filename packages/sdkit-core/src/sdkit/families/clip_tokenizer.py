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

The BPE itself is the ``tokenizers`` library's, configured as CLIP's (normalizer, pre-tokenizer,
``</w>`` suffix: ``configure_clip``). ``ClipTokenizerBase`` turns prompts into the text encoder's
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
from typing import Any

import numpy as np

from sdkit.errors import ModelFormatError

# CLIP's pre-tokenizer: contractions, letter runs, single digits, punctuation runs.
CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
VOCAB_SIZE = 49408
MERGES = VOCAB_SIZE - 2 * 256 - 2  # 48,894: CLIP reads lines 1 .. 49152-256-2 of the file
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
# A1111's extra-network tags (<lora:name:0.8>, <lyco:...>, <hypernet:...>): they choose networks
# and are no text for the encoder; A1111 removes them from the prompt it encodes, as here.
EXTRA_NETWORK_TAG = re.compile(r"<(?:lora|lyco|hypernet):[^<>]*>", re.IGNORECASE)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (CLIP's byte-level alphabet):
    printable Latin-1 bytes map to themselves, the other 68 to code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


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


def configure_clip(tokenizer: Any) -> Any:
    """Set CLIP's normalizer (NFC, collapsed whitespace, lower case), pre-tokenizer and decoder
    on a ``tokenizers.Tokenizer`` built on a CLIP BPE model; returns it."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def clip_bpe() -> Any:
    """A ``tokenizers.Tokenizer`` giving SD's CLIPTokenizer ids (no special tokens added)."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab, merges = vocab_and_merges()
    model = BPE(
        vocab=dict(vocab),
        merges=list(merges),
        continuing_subword_prefix="",
        end_of_word_suffix="</w>",
        fuse_unk=False,
        unk_token=EOS,
    )
    return configure_clip(Tokenizer(model))


class ClipTokenizerBase:
    """Prompt text -> fixed-length token-id windows for a CLIP text encoder.

    A subclass sets ``bos_token``, ``eos_token``, ``pad_token``, ``model_max_length`` and
    ``_tokenizer`` (a ``tokenizers.Tokenizer``), then calls ``_finish()``.
    """

    bos_token: str
    eos_token: str
    pad_token: str
    model_max_length: int
    _tokenizer: Any

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
        from tokenizers import AddedToken

        specials = sorted({self.bos_token, self.eos_token, self.pad_token})
        self._tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def _id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ModelFormatError(f"the tokenizer's vocabulary lacks the special token {token!r}")
        return int(token_id)

    def __len__(self) -> int:
        """The vocabulary size with added tokens (transformers' ``len(tokenizer)``)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def add_embedding(self, name: str, vectors: int) -> list[int]:
        """Register a textual-inversion embedding as diffusers' ``load_textual_inversion`` does:
        the tokens ``name``, ``name_1``, ... ``name_{vectors-1}`` with the next free ids; ``name``
        in a prompt then stands for all of them. Returns their ids (the same ones again when
        ``name`` is already registered with that many vectors)."""
        from tokenizers import AddedToken

        tokens = [name.lower()] + [f"{name.lower()}_{i}" for i in range(1, vectors)]
        known = [self._tokenizer.token_to_id(t) for t in tokens]
        if known[0] is not None and self._expand.get(int(known[0])) == known:
            return [int(i) for i in known]
        if any(i is not None for i in known):
            raise ModelFormatError(f"the embedding name {name!r} is already a token of the vocabulary; rename its file")
        self._tokenizer.add_tokens([AddedToken(t, normalized=True) for t in tokens])
        ids = [self._id(t) for t in tokens]
        self._expand[ids[0]] = ids
        return ids

    def tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids, without start/end tokens or truncation (A1111's
        ``<lora:...>`` tags removed, each embedding's trigger expanded to its tokens)."""
        text = EXTRA_NETWORK_TAG.sub("", prompt)
        encoding = self._tokenizer.encode(text.strip(), add_special_tokens=False)
        if not self._expand:
            return list(encoding.ids)
        return [t for i in encoding.ids for t in self._expand.get(i, [i])]

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
