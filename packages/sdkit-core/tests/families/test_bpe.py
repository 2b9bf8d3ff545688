"""sdkit's plain-Python CLIP BPE against Hugging Face ``tokenizers`` (the library transformers'
``CLIPTokenizerFast`` runs), configured here exactly as transformers' converter configures CLIP:
the same ids for every prompt of a corpus (fixed prompts, then seeded random strings over
ASCII, Latin-1, CJK, emoji, combining marks, Unicode white space and control characters), the
same decoded text, the same vocabulary size with special tokens and textual-inversion names.

``tokenizers`` is a test-time oracle only: sdkit does not install or import it
(``test_sdkit_does_not_need_tokenizers``).
"""

# ruff: noqa: RUF001  (the corpus holds look-alike characters on purpose)
from __future__ import annotations

import random
import subprocess
import sys
import unicodedata
from typing import Any

import pytest

from sdkit.families.bpe import ClipBPE
from sdkit.families.clip_tokenizer import BOS, EOS, vocab_and_merges

tokenizers = pytest.importorskip("tokenizers")

FIXED = [
    "a photo of an astronaut riding a horse on mars",
    "wow!!",
    "It's  a TEST\t\nof   whitespace",
    "masterpiece, (best quality:1.2), [cat|dog], 1girl, 8k uhd, <lora:x:0.8>",
    "Ünïcödé café naïve façade — “quotes” ‘single’ …",
    "日本語のテキスト 東京タワー",
    "emoji 👍🏽 🇫🇷 👨\u200d👩\u200d👧",
    "<|startoftext|>hello<|endoftext|> <|StartOfText|>",
    "numbers 12345 3.14 1e-5 ½ ² ٣",
    "I'll you've we're don't 'quoted' ''",
    "MyEmb in a MYEMB_1 prompt myembx",
    "ΑΣ ΣΑΣ Straße İstanbul",
    "e\u0301 a\u0300 ﬁ ① Ｆｕｌｌ",
    "tab\there\u00a0nbsp\u3000ideo\u2028ls \x1c\x1f \x00 \x7f",
    "",
    "   ",
    "hello-world foo_bar a/b c:d",
]
CHARS = "abcXYZ éüß日本 👍!?.,'\"-_:;()[]{}<>|/\\0123456789\t\n\u00a0\u0301\u200d\x1c\u2028"


def corpus() -> list[str]:
    rng = random.Random(0)
    texts = list(FIXED)
    texts += ["".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30))) for _ in range(600)]
    # Code points from many blocks; the ones Python's Unicode 14 tables do not assign (Cn) are
    # left out: the oracle's tables are newer (its letters) and older (its NFC) than Python's.
    pool = [
        chr(c) for c in [*range(0x20, 0x3100), *range(0xAC00, 0xAC40), *range(0xFF00, 0xFFF0), *range(0x1F300, 0x1F700)]
    ]
    pool = [c for c in pool if unicodedata.category(c) not in ("Cn", "Cs", "Mn", "Me")]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 25))) for _ in range(600)]
    return texts


def oracle(specials: list[str], names: list[str]) -> Any:
    """transformers' CLIPTokenizerFast pipeline (convert_slow_tokenizer.CLIPConverter)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
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
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    split = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(t, normalized=True) for t in names])
    return tok


@pytest.mark.parametrize("pad", [EOS, "!"])
def test_ids_and_text_match_tokenizers(pad: str) -> None:
    specials, names = sorted({BOS, EOS, pad}), ["myemb", "myemb_1"]
    hf = oracle(specials, names)
    vocab, merges = vocab_and_merges()
    ours = ClipBPE(vocab, merges, EOS)
    ours.add_special_tokens(specials)
    ours.add_tokens(names)
    assert ours.vocab_size() == hf.get_vocab_size(with_added_tokens=True) == 49410
    mismatched = [t for t in corpus() if ours.encode(t) != hf.encode(t, add_special_tokens=False).ids]
    assert mismatched == []
    for text in corpus()[:200]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids)


def test_sdkit_does_not_need_tokenizers() -> None:
    """The CLIP and T5 tokenizers encode with ``tokenizers`` unimportable."""
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from sdkit.families.clip_tokenizer import ShippedClipTokenizer\n"
        "from sdkit.pipelines.text.t5_tokenizer import T5Tokenizer\n"
        "print(ShippedClipTokenizer()('a cat')[0][:4].tolist(), T5Tokenizer().tokens('a cat'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[49406, 320, 2368, 49407] [3, 9, 1712]"
