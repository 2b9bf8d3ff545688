"""CLIP's byte-level BPE in plain Python: what Hugging Face ``tokenizers`` computes for SD's
``CLIPTokenizer`` / ``CLIPTokenizerFast``, without the 41 MB that library and the Hub client it
requires add to an install.

The steps, each as ``tokenizers`` 0.23 runs them for a CLIP tokenizer (checked token for token
against it on a corpus of prompts: ``tests/families/test_bpe.py``):

1. **Added tokens** split the text first: the special ones (start, end and padding tokens) on the
   raw text, then, after normalisation, the normalised ones (textual-inversion embeddings), each
   leftmost-longest.
2. **Normaliser**: NFC, every run of Unicode white space (the ``White_Space`` property, what
   Rust's regex ``\\s`` matches) to one space, lower case per code point (no final-sigma rule).
3. **Pre-tokeniser**: CLIP's pattern (``'s|'t|'re|'ve|'m|'ll|'d``, letter runs ``\\p{L}+``,
   single digits ``\\p{N}``, runs of anything else but white space), then the byte-level
   pre-tokeniser's GPT-2 pattern on each piece (digits in runs there), then each piece's UTF-8
   bytes mapped to GPT-2's printable byte alphabet.
4. **BPE**: ``</w>`` appended to a word's last symbol, then the adjacent pair with the lowest
   merge rank merged, left to right, until none is in the merge list; symbols to ids (a symbol
   outside the vocabulary is the unknown token).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from sdkit.errors import ModelFormatError

# Unicode's White_Space property: what Rust's regex \s matches (Python's str.isspace also takes
# U+001C..U+001F, which it does not).
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
WHITE_SPACE += "\u2028\u2029\u202f\u205f\u3000"
_WS_RUN = re.compile(f"[{re.escape(WHITE_SPACE)}]+")
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
_CLIP_SPECIALS = ("<|startoftext|>", "<|endoftext|>")  # CLIP's pattern names them first
END_OF_WORD = "</w>"


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


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _kind(char: str) -> str:
    """'L' letter, 'N' number, 'S' white space, 'P' anything else."""
    if char in WHITE_SPACE:
        return "S"
    major = unicodedata.category(char)[0]
    return major if major in "LN" else "P"


def _contraction_at(text: str, i: int) -> int:
    for c in _CONTRACTIONS:
        if text.startswith(c, i):
            return len(c)
    return 0


def scan(text: str, digit_runs: bool, specials: Sequence[str] = ()) -> list[str]:
    """The pieces a CLIP-like pattern matches in ``text`` (white space between them dropped):
    the ``specials`` first, contractions, letter runs, digits (single, or runs when
    ``digit_runs``: GPT-2's pattern), runs of other characters."""
    pieces: list[str] = []
    i, n = 0, len(text)
    while i < n:
        special = next((s for s in specials if text.startswith(s, i)), None)
        if special is not None:
            pieces.append(special)
            i += len(special)
            continue
        length = _contraction_at(text, i)
        kind = _kind(text[i])
        if length == 0 and kind == "S":
            i += 1
            continue
        if length == 0:
            j = i + 1
            if kind != "N" or digit_runs:
                while j < n and _kind(text[j]) == kind:
                    j += 1
            length = j - i
        pieces.append(text[i : i + length])
        i += length
    return pieces


def normalize_clip(text: str) -> str:
    """NFC, white-space runs to one space, lower case per code point."""
    text = _WS_RUN.sub(" ", unicodedata.normalize("NFC", text))
    return "".join(c.lower() for c in text)


@lru_cache(maxsize=64)
def _alternation(tokens: frozenset[str]) -> re.Pattern[str] | None:
    """One pattern matching any of ``tokens``, longest first (leftmost-longest), built once per set."""
    alternatives = sorted((t for t in tokens if t), key=lambda t: (-len(t), t))
    return re.compile("|".join(re.escape(t) for t in alternatives)) if alternatives else None


def split_on(text: str, tokens: Iterable[str]) -> list[tuple[str, bool]]:
    """``text`` cut at every leftmost-longest occurrence of ``tokens``: (part, is_token) pairs."""
    pattern = _alternation(frozenset(tokens))
    if pattern is None:
        return [(text, False)] if text else []
    parts: list[tuple[str, bool]] = []
    start = 0
    for match in pattern.finditer(text):
        if match.start() > start:
            parts.append((text[start : match.start()], False))
        parts.append((match.group(), True))
        start = match.end()
    if start < len(text):
        parts.append((text[start:], False))
    return parts


class ClipBPE:
    """A CLIP byte-level BPE tokenizer on a vocabulary and merge list."""

    def __init__(self, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]], unk_token: str) -> None:
        self.vocab = dict(vocab)
        for a, b in merges:
            if a not in self.vocab or b not in self.vocab or a + b not in self.vocab:
                raise ModelFormatError(f"the tokenizer's merge {a} {b} names a token outside its vocabulary")
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.unk_id = self.vocab.get(unk_token)
        self.added: dict[str, int] = {}
        self.special: set[str] = set()
        self.normalized_added: dict[str, str] = {}  # normalised content -> content
        self._id_to_token = {i: t for t, i in self.vocab.items()}
        self._cache: dict[str, list[int]] = {}

    # vocabulary -----------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        if token in self.added:
            return self.added[token]
        return self.vocab.get(token)

    def vocab_size(self) -> int:
        """The vocabulary with the added tokens that are not in it (transformers' ``len``)."""
        return len(self.vocab) + sum(1 for t in self.added if t not in self.vocab)

    def _add(self, token: str) -> int:
        token_id = self.token_to_id(token)
        if token_id is None:
            token_id = self.vocab_size()
        self.added[token] = token_id
        self._id_to_token.setdefault(token_id, token)
        return token_id

    def add_special_tokens(self, tokens: Iterable[str]) -> None:
        """Tokens matched on the raw text (not normalised), skipped by ``decode``."""
        for token in tokens:
            self._add(token)
            self.special.add(token)

    def add_tokens(self, tokens: Iterable[str]) -> None:
        """Tokens matched on the normalised text (textual-inversion names)."""
        for token in tokens:
            self._add(token)
            self.normalized_added[normalize_clip(token)] = token

    # encoding -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, is_special in split_on(text, self.special):
            if is_special:
                ids.append(self.added[part])
                continue
            for piece, is_added in split_on(normalize_clip(part), self.normalized_added):
                if is_added:
                    ids.append(self.added[self.normalized_added[piece]])
                    continue
                for word in scan(piece, digit_runs=False, specials=_CLIP_SPECIALS):
                    for sub in scan(word, digit_runs=True):
                        ids.extend(self._word(sub))
        return ids

    def _word(self, word: str) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = [_BYTE_TO_CHAR[b] for b in word.encode("utf-8")]
        symbols[-1] += END_OF_WORD
        while len(symbols) > 1:
            ranked = [(self.ranks.get((a, b)), i) for i, (a, b) in enumerate(itertools.pairwise(symbols))]
            best = min((r for r in ranked if r[0] is not None), default=None)
            if best is None:
                break
            pair = (symbols[best[1]], symbols[best[1] + 1])
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(pair[0] + pair[1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = [self.vocab[s] if s in self.vocab else self._unk(s) for s in symbols]
        if len(self._cache) < 10_000:
            self._cache[word] = ids
        return ids

    def _unk(self, symbol: str) -> int:
        if self.unk_id is None:
            raise ModelFormatError(f"the tokenizer has no token for {symbol!r} and no unknown token")
        return self.unk_id

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (special tokens skipped), bytes restored; ``</w>`` kept as text."""
        tokens = [self._id_to_token.get(int(i), "") for i in ids]
        kept = [t for t in tokens if t not in self.special]
        data = bytes(_CHAR_TO_BYTE[c] for t in kept for c in t if c in _CHAR_TO_BYTE)
        return data.decode("utf-8", errors="replace")
