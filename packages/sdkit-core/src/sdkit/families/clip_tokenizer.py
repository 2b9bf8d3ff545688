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

The BPE itself is the ``tokenizers`` library's, configured as ``sdkit.pipelines.tokenizer``
configures CLIP (normalizer, pre-tokenizer, ``</w>`` suffix).
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from importlib import resources
from typing import Any

from sdkit.pipelines.tokenizer import _CLIP_SPLIT, ClipTokenizer

VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
VOCAB_SIZE = 49408
MERGES = VOCAB_SIZE - 2 * 256 - 2  # 48,894: CLIP reads lines 1 .. 49152-256-2 of the file
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


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


def clip_bpe() -> Any:
    """A ``tokenizers.Tokenizer`` giving SD's CLIPTokenizer ids (no special tokens added)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab, merges = vocab_and_merges()
    tokenizer = Tokenizer(
        BPE(
            vocab=dict(vocab),
            merges=list(merges),
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token=EOS,
        )
    )
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


class ShippedClipTokenizer(ClipTokenizer):
    """``ClipTokenizer`` on the shipped vocabulary, for checkpoints that carry no tokenizer.

    ``pad_token`` is ``<|endoftext|>`` for SD 1.x and SDXL's first encoder, ``"!"`` for SD 2.x
    and SDXL's OpenCLIP-bigG encoder (what their diffusers ``tokenizer_config.json`` say).
    """

    def __init__(self, pad_token: str = EOS, model_max_length: int = 77) -> None:
        # ClipTokenizer's constructor reads a folder; this sets the same fields from the
        # shipped vocabulary instead.
        self.bos_token, self.eos_token, self.pad_token = BOS, EOS, pad_token
        self.model_max_length = model_max_length
        self._tokenizer = clip_bpe()
        self._add_specials()
        self.bos_id = self._id(BOS)
        self.eos_id = self._id(EOS)
        self.pad_id = self._id(pad_token)

    def _add_specials(self) -> None:
        # transformers' CLIPTokenizer registers every special token, the pad token "!" of SD 2.x
        # included, as an added token that splits the text: "wow!!" is then "wow", "!", "!"
        # (ids 0, 0), not the merged "!!" token. ClipTokenizer adds only the "<|...|>" ones.
        from tokenizers import AddedToken

        specials = sorted({self.bos_token, self.eos_token, self.pad_token})
        self._tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
