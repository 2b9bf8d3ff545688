"""T5's SentencePiece Unigram tokenizer in plain Python, read from a ``tokenizer.json``: what
Hugging Face ``tokenizers`` computes for transformers' ``T5TokenizerFast`` (the tokenizer of SD3,
Flux and Chroma pipelines), without that library.

The steps, as ``tokenizers`` 0.23 runs them (checked piece for piece against it on a corpus of
prompts in ``tests/pipelines/test_unigram.py``):

1. **Added tokens** (``<pad>``, ``</s>``, ``<unk>``, ``<extra_id_N>``: not normalised) split the
   raw text first, leftmost-longest.
2. **Normalisers** in the file's order. ``Precompiled`` is SentencePiece's ``nmt_nfkc`` rule set
   as a double-array trie (darts-clone units) over UTF-8 bytes with NUL-terminated replacements:
   for each extended grapheme cluster (Unicode UAX #29) under 6 bytes, the *shortest* trie key
   that prefixes it replaces the whole cluster; otherwise each code point is looked up alone.
   ``Strip`` trims white space, ``Replace`` substitutes a pattern (T5: two or more spaces -> ``▁``).
3. **Pre-tokeniser** ``Metaspace``: spaces become ``▁``, a ``▁`` is put in front (``always``), and
   the text splits before every ``▁``; ``WhitespaceSplit`` first where the file has it.
4. **Unigram**: the Viterbi best segmentation of each piece over the vocabulary's log
   probabilities (f64 sums, a later candidate replacing an earlier only when strictly better);
   a code point no piece covers costs ``min score - 10`` as the unknown token, and consecutive
   unknowns fuse into one ``<unk>``.

Grapheme clusters are found with the rules of UAX #29 on properties derived from Python's
``unicodedata`` (Extend = non-spacing and enclosing marks, ZWJ/ZWNJ, emoji modifiers, tags;
SpacingMark = spacing marks; Hangul syllable types; regional-indicator pairs; emoji ZWJ
sequences). Indic conjunct clusters (GB9c) are not joined; they only matter where the rule set
has a key for such a cluster.
"""

from __future__ import annotations

import base64
import re
import struct
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sdkit.errors import ModelFormatError
from sdkit.families.bpe import WHITE_SPACE, split_on

UNK_PENALTY = 10.0
METASPACE = "\u2581"


# --- the Precompiled normaliser ---------------------------------------------------------------
class Charsmap:
    """SentencePiece's precompiled character map: a darts-clone double array + replacements."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise ModelFormatError("the tokenizer's precompiled_charsmap is truncated")
        (trie_size,) = struct.unpack_from("<I", blob, 0)
        if trie_size % 4 or 4 + trie_size > len(blob):
            raise ModelFormatError("the tokenizer's precompiled_charsmap has a bad trie size")
        self.units = struct.unpack_from(f"<{trie_size // 4}I", blob, 4)
        self.normalized = blob[4 + trie_size :]
        self._cache: dict[str, str | None] = {}

    def _first_prefix_value(self, key: bytes) -> int | None:
        units = self.units
        if not units:
            return None
        unit = units[0]
        node = (unit >> 10) << ((unit & (1 << 9)) >> 6)
        for byte in key:
            if byte == 0:
                return None
            node ^= byte
            if node >= len(units):
                return None
            unit = units[node]
            if unit & ((1 << 31) | 0xFF) != byte:
                return None
            node ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
            if (unit >> 8) & 1:
                return units[node] & ((1 << 31) - 1) if node < len(units) else None
        return None

    def transform(self, chunk: str) -> str | None:
        """The replacement of the shortest key prefixing ``chunk``, or None."""
        if chunk in self._cache:
            return self._cache[chunk]
        index = self._first_prefix_value(chunk.encode("utf-8"))
        result = None
        if index is not None and index <= len(self.normalized):
            end = self.normalized.find(b"\0", index)
            raw = self.normalized[index : end if end >= 0 else len(self.normalized)]
            result = raw.decode("utf-8", errors="replace")
        if len(self._cache) < 50_000:
            self._cache[chunk] = result
        return result

    def normalize(self, text: str) -> str:
        out: list[str] = []
        for cluster in graphemes(text):
            if len(cluster.encode("utf-8")) < 6:
                norm = self.transform(cluster)
                if norm is not None:
                    out.append(norm)
                    continue
            for char in cluster:
                norm = self.transform(char)
                out.append(char if norm is None else norm)
        return "".join(out)


# --- grapheme clusters (UAX #29) --------------------------------------------------------------
_PREPEND = {0x0600, 0x0601, 0x0602, 0x0603, 0x0604, 0x0605, 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD}
_EXT_PICT = (
    (0x00A9, 0x00A9), (0x00AE, 0x00AE), (0x203C, 0x203C), (0x2049, 0x2049), (0x2122, 0x2122),
    (0x2139, 0x2139), (0x2194, 0x2199), (0x21A9, 0x21AA), (0x231A, 0x231B), (0x2328, 0x2328),
    (0x2388, 0x2388), (0x23CF, 0x23CF), (0x23E9, 0x23F3), (0x23F8, 0x23FA), (0x24C2, 0x24C2),
    (0x25AA, 0x25AB), (0x25B6, 0x25B6), (0x25C0, 0x25C0), (0x25FB, 0x25FE), (0x2600, 0x2605),
    (0x2607, 0x2612), (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712), (0x2714, 0x2714),
    (0x2716, 0x2716), (0x271D, 0x271D), (0x2721, 0x2721), (0x2728, 0x2728), (0x2733, 0x2734),
    (0x2744, 0x2744), (0x2747, 0x2747), (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755),
    (0x2757, 0x2757), (0x2763, 0x2767), (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0),
    (0x27BF, 0x27BF), (0x2934, 0x2935), (0x2B05, 0x2B07), (0x2B1B, 0x2B1C), (0x2B50, 0x2B50),
    (0x2B55, 0x2B55), (0x3030, 0x3030), (0x303D, 0x303D), (0x3297, 0x3297), (0x3299, 0x3299),
    (0x1F000, 0x1F0FF), (0x1F10D, 0x1F10F), (0x1F12F, 0x1F12F), (0x1F16C, 0x1F171),
    (0x1F17E, 0x1F17F), (0x1F18E, 0x1F18E), (0x1F191, 0x1F19A), (0x1F1AD, 0x1F1E5),
    (0x1F201, 0x1F20F), (0x1F21A, 0x1F21A), (0x1F22F, 0x1F22F), (0x1F232, 0x1F23A),
    (0x1F23C, 0x1F23F), (0x1F249, 0x1F3FA), (0x1F400, 0x1F53D), (0x1F546, 0x1F64F),
    (0x1F680, 0x1F6FF), (0x1F774, 0x1F77F), (0x1F7D5, 0x1F7FF), (0x1F80C, 0x1F80F),
    (0x1F848, 0x1F84F), (0x1F85A, 0x1F85F), (0x1F888, 0x1F88F), (0x1F8AE, 0x1F8FF),
    (0x1F90C, 0x1F93A), (0x1F93C, 0x1F945), (0x1F947, 0x1FAFF), (0x1FC00, 0x1FFFD),
)  # fmt: skip


def _in_ranges(cp: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


@lru_cache(maxsize=4096)
def _gcb(char: str) -> str:
    """The Grapheme_Cluster_Break property of one code point (see the module notes)."""
    cp = ord(char)
    if char == "\r":
        return "CR"
    if char == "\n":
        return "LF"
    if cp == 0x200D:
        return "ZWJ"
    if 0x1F1E6 <= cp <= 0x1F1FF:
        return "RI"
    if cp in _PREPEND:
        return "Prepend"
    if cp == 0x200C or 0x1F3FB <= cp <= 0x1F3FF or 0xE0020 <= cp <= 0xE007F or cp in (0xFF9E, 0xFF9F):
        return "Extend"
    category = unicodedata.category(char)
    if category in ("Mn", "Me"):
        return "Extend"
    if category == "Mc":
        return "SpacingMark"
    if category in ("Cc", "Zl", "Zp", "Cf"):
        return "Control"
    if 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97C:
        return "L"
    if 0x1160 <= cp <= 0x11A7 or 0xD7B0 <= cp <= 0xD7C6:
        return "V"
    if 0x11A8 <= cp <= 0x11FF or 0xD7CB <= cp <= 0xD7FB:
        return "T"
    if 0xAC00 <= cp <= 0xD7A3:
        return "LV" if (cp - 0xAC00) % 28 == 0 else "LVT"
    if _in_ranges(cp, _EXT_PICT):
        return "ExtPict"
    return "Other"


_HANGUL_JOIN = {("L", "L"), ("L", "V"), ("L", "LV"), ("L", "LVT"), ("LV", "V"), ("V", "V"), ("LV", "T")}
_HANGUL_JOIN |= {("V", "T"), ("LVT", "T"), ("T", "T")}


def _joins(prev: str, cur: str, pict_zwj: bool, ri_odd: bool) -> bool:
    """Whether no cluster boundary lies between two code points of these properties."""
    if prev == "CR" and cur == "LF":
        return True
    if prev in ("Control", "CR", "LF") or cur in ("Control", "CR", "LF"):
        return False
    if (prev, cur) in _HANGUL_JOIN:
        return True
    if cur in ("Extend", "ZWJ", "SpacingMark") or prev == "Prepend":
        return True
    if prev == "ZWJ" and cur == "ExtPict" and pict_zwj:
        return True
    return prev == "RI" and cur == "RI" and ri_odd


def graphemes(text: str) -> list[str]:
    """``text``'s extended grapheme clusters."""
    clusters: list[str] = []
    start = 0
    prev = ""
    pict_zwj = False  # ExtPict Extend* ZWJ just seen
    in_pict = False  # ExtPict Extend* just seen
    ri_run = 0
    for i, char in enumerate(text):
        cur = _gcb(char)
        if i and not _joins(prev, cur, pict_zwj, ri_run % 2 == 1):
            clusters.append(text[start:i])
            start = i
        pict_zwj = in_pict and cur == "ZWJ"
        in_pict = cur == "ExtPict" or (in_pict and cur == "Extend")
        ri_run = ri_run + 1 if cur == "RI" else 0
        prev = cur
    if start < len(text):
        clusters.append(text[start:])
    return clusters


# --- the tokenizer ------------------------------------------------------------------------------
def _strip(text: str, left: bool, right: bool) -> str:
    if left:
        text = text.lstrip(WHITE_SPACE)
    if right:
        text = text.rstrip(WHITE_SPACE)
    return text


class Unigram:
    """A SentencePiece Unigram tokenizer from a ``tokenizer.json`` (T5's layout)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        model = spec.get("model")
        if not isinstance(model, Mapping) or model.get("type") != "Unigram":
            raise ModelFormatError("the tokenizer.json is not a Unigram (SentencePiece) tokenizer")
        vocab = model.get("vocab")
        if not isinstance(vocab, list) or not vocab:
            raise ModelFormatError("the tokenizer.json's Unigram vocabulary is missing")
        try:
            self.pieces = [str(piece) for piece, _ in vocab]
            self.scores = [float(score) for _, score in vocab]
        except (TypeError, ValueError):
            raise ModelFormatError("the tokenizer.json's Unigram vocabulary is not [piece, score] pairs") from None
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.max_piece = max(len(p) for p in self.pieces)
        unk = model.get("unk_id")
        self.unk_id = unk if isinstance(unk, int) and 0 <= unk < len(self.pieces) else None
        self.unk_score = min(self.scores) - UNK_PENALTY
        self.fuse_unk = bool(model.get("fuse_unk", True))
        self.added = self._added_tokens(spec.get("added_tokens"))
        self.special = {t for t, (_, special) in self.added.items() if special}
        self.normalizers = self._normalizers(spec.get("normalizer"))
        self.pre_tokenizers = self._pre_tokenizers(spec.get("pre_tokenizer"))
        self._cache: dict[str, list[int]] = {}

    def _added_tokens(self, entries: Any) -> dict[str, tuple[int, bool]]:
        added: dict[str, tuple[int, bool]] = {}
        for entry in entries if isinstance(entries, list) else []:
            if (
                isinstance(entry, Mapping)
                and isinstance(entry.get("content"), str)
                and isinstance(entry.get("id"), int)
            ):
                if entry.get("normalized", False):
                    raise ModelFormatError("the tokenizer.json's normalised added tokens are not supported")
                added[entry["content"]] = (entry["id"], bool(entry.get("special", False)))
        return added

    @staticmethod
    def _flatten(node: Any, what: str) -> list[Mapping[str, Any]]:
        if node is None:
            return []
        if not isinstance(node, Mapping):
            raise ModelFormatError(f"the tokenizer.json's {what} is not an object")
        if node.get("type") == "Sequence":
            inner = node.get("normalizers" if what == "normalizer" else "pretokenizers")
            return [n for item in (inner if isinstance(inner, list) else []) for n in Unigram._flatten(item, what)]
        return [node]

    def _normalizers(self, node: Any) -> list[Any]:
        steps: list[Any] = []
        for item in self._flatten(node, "normalizer"):
            kind = item.get("type")
            if kind == "Precompiled":
                try:
                    blob = base64.b64decode(str(item.get("precompiled_charsmap", "")), validate=True)
                except ValueError:
                    raise ModelFormatError("the tokenizer.json's precompiled_charsmap is not base64") from None
                steps.append(Charsmap(blob).normalize)
            elif kind == "Strip":
                left, right = bool(item.get("strip_left", True)), bool(item.get("strip_right", True))
                steps.append(lambda t, left=left, right=right: _strip(t, left, right))
            elif kind == "Replace":
                steps.append(self._replace(item))
            else:
                raise ModelFormatError(f"the tokenizer.json's normaliser {kind!r} is not supported")
        return steps

    @staticmethod
    def _replace(item: Mapping[str, Any]) -> Any:
        pattern, content = item.get("pattern"), item.get("content")
        if not isinstance(pattern, Mapping) or not isinstance(content, str):
            raise ModelFormatError("the tokenizer.json's Replace normaliser is malformed")
        if isinstance(pattern.get("String"), str):
            literal = pattern["String"]
            return lambda t: t.replace(literal, content) if literal else t
        try:
            regex = re.compile(str(pattern.get("Regex")))
        except re.error:
            raise ModelFormatError("the tokenizer.json's Replace pattern is not a regular expression") from None
        return lambda t: regex.sub(lambda _m: content, t)

    def _pre_tokenizers(self, node: Any) -> list[tuple[str, str, bool, bool]]:
        steps: list[tuple[str, str, bool, bool]] = []
        for item in self._flatten(node, "pre_tokenizer"):
            kind = item.get("type")
            if kind == "WhitespaceSplit":
                steps.append(("split", "", False, False))
            elif kind == "Metaspace":
                replacement = str(item.get("replacement", METASPACE))
                scheme = item.get("prepend_scheme", "always" if item.get("add_prefix_space", True) else "never")
                if scheme not in ("always", "first", "never"):
                    raise ModelFormatError(f"the tokenizer.json's Metaspace prepend_scheme {scheme!r} is not supported")
                steps.append(("metaspace", replacement, scheme != "never", bool(item.get("split", True))))
            else:
                raise ModelFormatError(f"the tokenizer.json's pre-tokeniser {kind!r} is not supported")
        return steps

    # encoding ------------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        if token in self.added:
            return self.added[token][0]
        return self.ids.get(token)

    def vocab_size(self) -> int:
        return len(self.pieces) + sum(1 for t in self.added if t not in self.ids)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, is_added in split_on(text, self.added):
            if is_added:
                ids.append(self.added[part][0])
                continue
            text = part
            for step in self.normalizers:
                text = step(text)
            for word in self._pre_tokenize(text):
                ids.extend(self._word(word))
        return ids

    def _pre_tokenize(self, text: str) -> list[str]:
        pieces = [text] if text else []
        for kind, replacement, prepend, split in self.pre_tokenizers:
            if kind == "split":
                pieces = [w for p in pieces for w in re.split(f"[{re.escape(WHITE_SPACE)}]+", p) if w]
                continue
            out: list[str] = []
            for piece in pieces:
                marked = piece.replace(" ", replacement)
                if prepend and not marked.startswith(replacement):
                    marked = replacement + marked
                out.extend(_split_before(marked, replacement) if split else [marked])
            pieces = out
        return pieces

    def _word(self, word: str) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        ids = [self.ids.get(piece, self.unk_id if self.unk_id is not None else -1) for piece in self._viterbi(word)]
        if any(i < 0 for i in ids):
            raise ModelFormatError("the tokenizer has no <unk> piece for text outside its vocabulary")
        if len(self._cache) < 10_000:
            self._cache[word] = ids
        return ids

    def _viterbi(self, word: str) -> list[str]:
        n = len(word)
        score: list[float | None] = [0.0] + [None] * n
        start: list[int] = [0] * (n + 1)
        unknown: list[bool] = [False] * (n + 1)
        for i in range(n):
            base = score[i]
            if base is None:
                continue
            single = False
            for j in range(i + 1, min(n, i + self.max_piece) + 1):
                piece_id = self.ids.get(word[i:j])
                if piece_id is None:
                    continue
                candidate = base + self.scores[piece_id]
                best = score[j]
                if best is None or candidate > best:
                    score[j], start[j], unknown[j] = candidate, i, piece_id == self.unk_id
                single = single or j == i + 1
            if not single:
                candidate = base + self.unk_score
                best = score[i + 1]
                if best is None or candidate > best:
                    score[i + 1], start[i + 1], unknown[i + 1] = candidate, i, True
        return self._backtrack(word, start, unknown)

    def _backtrack(self, word: str, start: Sequence[int], unknown: Sequence[bool]) -> list[str]:
        pieces: list[str] = []
        pending = ""  # fused unknown text, read right to left
        end = len(word)
        while end > 0:
            begin = start[end]
            if self.fuse_unk and self.unk_id is not None and unknown[end]:
                pending = word[begin:end] + pending
            else:
                if pending:
                    pieces.append(pending)
                    pending = ""
                pieces.append(word[begin:end])
            end = begin
        if pending:
            pieces.append(pending)
        pieces.reverse()
        return pieces

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (special tokens skipped), ``▁`` read as a space."""
        by_id = {i: t for t, (i, _) in self.added.items()}
        tokens = []
        for i in ids:
            token = (
                by_id.get(int(i))
                if int(i) in by_id
                else (self.pieces[int(i)] if 0 <= int(i) < len(self.pieces) else "")
            )
            if token is not None and token not in self.special:
                tokens.append(token)
        return "".join(tokens).replace(METASPACE, " ").removeprefix(" ")


def _split_before(text: str, mark: str) -> list[str]:
    """``text`` split before every ``mark`` (tokenizers' MergedWithNext)."""
    pieces: list[str] = []
    current = ""
    for char in text:
        if char == mark and current:
            pieces.append(current)
            current = ""
        current += char
    if current:
        pieces.append(current)
    return pieces
