"""sdkit's plain-Python T5 Unigram tokenizer against Hugging Face ``tokenizers`` on the same
``tokenizer.json`` (the shipped T5 one, what transformers' T5TokenizerFast reads): the same ids
for every prompt of a corpus (fixed prompts incl. CRLF, combining sequences, emoji ZWJ
sequences, flags, Hangul jamo, special tokens written in the text, double spaces; then seeded
random strings over many Unicode blocks), the same decoded text, and the same grapheme-cluster
boundaries where they change the normalisation. ``tokenizers`` is a test-time oracle only."""

# ruff: noqa: RUF001  (the corpus holds look-alike characters on purpose)
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from sdkit.errors import ModelFormatError
from sdkit.pipelines.text.t5_tokenizer import SHIPPED
from sdkit.pipelines.text.unigram import Unigram, graphemes

tokenizers = pytest.importorskip("tokenizers")

FIXED = [
    "a photo of an astronaut riding a horse on mars",
    "It's  a TEST\t\nof   whitespace  ",
    "masterpiece, (best quality:1.2), [cat|dog], 1girl, 8k uhd",
    "Ünïcödé café naïve façade — “quotes” ‘single’ …",
    "日本語のテキスト 東京タワー 한국어 각",
    "emoji 👍🏽 🇫🇷🇩🇪 👨\u200d👩\u200d👧 🏳️\u200d🌈 ❤️ 1️⃣",
    "</s> hello <pad><extra_id_0>x <unk>",
    "numbers 12345 3.14 1e-5 ½ ² ٣ ㈱ ㍻",
    "cafe\u0301 e\u0301 a\u0300 ﬁ ① Ｆｕｌｌ",
    "tab\there\u00a0nbsp\u3000ideo\u2028ls \x1c\x1f \x00 \x7f",
    "line\r\nbreak\r\n\r\nx",
    "\u200b\u200c\u200d zero width क्षि हिन्दी",
    "",
    "   ",
]
CHARS = "abcXYZ éüß日本 👍🏽!?.,'\"-_:;()[]{}<>|/\\0123456789\t\n\r\u00a0\u0301\u200d\u3000ﬁ①Ｆ한각🇫🇷"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as handle:
        return dict(json.load(handle))


@pytest.fixture(scope="module")
def pair(spec: dict[str, Any]) -> tuple[Unigram, Any]:
    hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
    hf.post_processor = None
    return Unigram(spec), hf


def corpus() -> list[str]:
    rng = random.Random(0)
    texts = list(FIXED)
    texts += ["".join(rng.choice(CHARS) for _ in range(rng.randint(0, 40))) for _ in range(600)]
    marks = [0x200D, 0x200C, 0xFE0F, 0x20E3, 0x0D, 0x0A, 0xE0061, 0x0600, 0x0915, 0x094D, 0x0301] * 20
    blocks = [*range(0x20, 0x3100), *range(0xAC00, 0xAC40), *range(0x1100, 0x1200), *range(0xFF00, 0xFFF0)]
    pool = [chr(c) for c in [*blocks, *range(0x1F300, 0x1F700), *range(0x1F1E6, 0x1F200), *marks]]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 25))) for _ in range(800)]
    return texts


def test_ids_and_text_match_tokenizers(pair: tuple[Unigram, Any]) -> None:
    ours, hf = pair
    assert ours.vocab_size() == hf.get_vocab_size(with_added_tokens=True) == 32100
    texts = corpus()
    mismatched = [t for t in texts if ours.encode(t) != hf.encode(t, add_special_tokens=False).ids]
    assert mismatched == []
    for text in texts[:300]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_grapheme_clusters() -> None:
    """UAX #29 cases the normaliser depends on (one cluster each, then boundaries)."""
    for cluster in ["\r\n", "e\u0301", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧", "각", "\u1100\u1161\u11a8", "1\ufe0f\u20e3"]:
        assert graphemes(cluster) == [cluster]
    assert graphemes("\n\r") == ["\n", "\r"]
    assert graphemes("🇫🇷🇩") == ["🇫🇷", "🇩"]
    assert graphemes("a\u200db") == ["a\u200d", "b"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["model"].update(type="BPE"), "not a Unigram"),
        (lambda s: s["model"].update(vocab=[["a"]]), "piece, score"),
        (lambda s: s.update(normalizer={"type": "BertNormalizer"}), "BertNormalizer"),
        (lambda s: s.update(pre_tokenizer={"type": "ByteLevel"}), "ByteLevel"),
        (lambda s: s["normalizer"]["normalizers"][0].update(precompiled_charsmap="!!"), "base64"),
    ],
)
def test_unsupported_files_are_refused(spec: dict[str, Any], edit: Any, message: str) -> None:
    broken = json.loads(json.dumps(spec))
    edit(broken)
    with pytest.raises(ModelFormatError, match=message):
        Unigram(broken)


def test_tokenizer_json_folder(tmp_path: Path, spec: dict[str, Any]) -> None:
    from sdkit.pipelines.text.t5_tokenizer import T5Tokenizer

    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    assert T5Tokenizer(tmp_path).tokens("a cat") == T5Tokenizer().tokens("a cat") == [3, 9, 1712]
    (tmp_path / "tokenizer.json").write_text("{", encoding="utf-8")
    with pytest.raises(ModelFormatError, match="cannot be read"):
        T5Tokenizer(tmp_path)
