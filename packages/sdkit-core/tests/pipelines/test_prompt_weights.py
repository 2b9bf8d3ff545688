"""A1111's prompt attention syntax and long-prompt chunking.

Oracles: A1111's own doctests of ``modules/prompt_parser.parse_prompt_attention`` (copied as the
expected values, float for float), the syntax documented on A1111's wiki ("Attention/emphasis":
``(word)`` x1.1, ``[word]`` /1.1, ``(word:1.5)``, ``\\(`` literal, ``BREAK`` starts a new chunk),
chunk layouts worked by hand from ``modules/sd_hijack_clip.tokenize_line`` with the tiny CLIP
tokenizer of ``fixtures/tiny_pipeline``, whose ids transformers' CLIPTokenizer produced
(``golden.npz`` ``token_ids``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit.pipelines.text.prompt_chunks import PromptChunk, SpecialTokens, encode_chunks, pad_chunks, prompt_chunks
from sdkit.pipelines.text.prompt_weights import apply_emphasis, parse_prompt_attention

TOKENIZER = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_pipeline" / "model" / "tokenizer"

# A1111's doctests (prompt_parser.py), then cases from its wiki's documented syntax.
CASES: list[tuple[str, list[tuple[str, float]]]] = [
    ("normal text", [("normal text", 1.0)]),
    ("an (important) word", [("an ", 1.0), ("important", 1.1), (" word", 1.0)]),
    ("(unbalanced", [("unbalanced", 1.1)]),
    ("\\(literal\\]", [("(literal]", 1.0)]),
    ("(unnecessary)(parens)", [("unnecessaryparens", 1.1)]),
    (
        "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
        [
            ("a ", 1.0),
            ("house", 1.5730000000000004),
            (" ", 1.1),
            ("on", 1.0),
            (" a ", 1.1),
            ("hill", 0.55),
            (", sun, ", 1.1),
            ("sky", 1.4641000000000006),
            (".", 1.1),
        ],
    ),
    ("", [("", 1.0)]),
    ("((word))", [("word", 1.2100000000000002)]),
    ("[word]", [("word", 1 / 1.1)]),
    ("[[word]]", [("word", (1 / 1.1) * (1 / 1.1))]),
    ("(word:1.5)", [("word", 1.5)]),
    ("(word: 0.8 )", [("word", 0.8)]),  # whitespace around the number
    ("(word:-1)", [("word", -1.0)]),
    ("word:1.5)", [("word:1.5)", 1.0)]),  # no open bracket: plain text
    ("a ) b ] c", [("a ) b ] c", 1.0)]),  # unmatched closers are text
    ("a:b", [("a:b", 1.0)]),
    ("\\\\ back\\slash", [("\\ backslash", 1.0)]),  # a lone backslash escapes nothing: dropped
    ("cat BREAK dog", [("cat", 1.0), ("BREAK", -1.0), ("dog", 1.0)]),
    # A1111 weights the BREAK piece too; at -1.1 its chunker no longer sees a BREAK (a quirk kept)
    ("(cat BREAK dog)", [("cat", 1.1), ("BREAK", -1.1), ("dog", 1.1)]),
    ("BREAKING news", [("BREAKING news", 1.0)]),  # \bBREAK\b: not inside a word
    ("[a (b:2)]", [("a ", 1 / 1.1), ("b", 2 / 1.1)]),
]


@pytest.mark.parametrize(("prompt", "expected"), CASES, ids=[c[0] or "<empty>" for c in CASES])
def test_parse_prompt_attention(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert parse_prompt_attention(prompt) == expected


def test_emphasis_restores_the_mean() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((1, 7, 4)).astype(np.float32) + 0.5
    weights = np.array([[1.0, 1.1, 1.1, 0.5, 1.0, 2.0, 1.0]])
    out = apply_emphasis(z, weights)
    assert out.dtype == np.float32
    assert out.mean() == pytest.approx(float(z.mean()), rel=1e-5)
    # token vectors keep their direction; their ratios are the weight ratios
    ratio = out / z
    assert np.allclose(ratio / ratio[:, :1], (weights / weights[:, :1])[..., None], rtol=1e-5)
    with pytest.raises(InputError):
        apply_emphasis(z, weights[:, :3])


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    if not (TOKENIZER / "vocab.json").is_file():
        pytest.skip("tiny tokenizer fixture missing")
    from sdkit.pipelines.text.clip_tokenizer import ClipTokenizer

    return ClipTokenizer(TOKENIZER)


def special(tok) -> SpecialTokens:  # type: ignore[no-untyped-def]
    return SpecialTokens(start=tok.bos_id, end=tok.eos_id, pad=tok.pad_id, comma=tok._tokenizer.token_to_id(",</w>"))


def test_short_prompt_is_the_diffusers_window(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Without weights, one chunk equals what the tokenizer gives diffusers (start, ids, end, pad)."""
    prompt = "a photo of an astronaut riding a horse on the moon"
    (chunk,) = prompt_chunks(prompt, tokenizer.tokens, special(tokenizer))
    assert chunk.tokens == tokenizer([prompt])[0].tolist()
    assert chunk.weights == [1.0] * 77
    assert prompt_chunks(prompt, tokenizer.tokens, special(tokenizer), truncate=True)[0].tokens == chunk.tokens


def test_weights_follow_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    chunk = prompt_chunks("a (red:1.5) cat [dog]", tokenizer.tokens, special(tokenizer))[0]
    ids = [tokenizer.tokens(w)[0] for w in ("a", "red", "cat", "dog")]
    assert chunk.tokens[:6] == [tokenizer.bos_id, *ids, tokenizer.eos_id]
    assert chunk.weights[:6] == [1.0, 1.0, 1.5, 1.0, 1 / 1.1, 1.0]


def test_long_prompt_chunks_of_75(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """40 x "a red cat" = 120 tokens: A1111 makes 75 + 45 (two windows); diffusers keeps 75."""
    prompt = " ".join(["a red cat"] * 40)
    ids = tokenizer.tokens(prompt)
    assert len(ids) == 120
    first, second = prompt_chunks(prompt, tokenizer.tokens, special(tokenizer))
    assert first.tokens == [tokenizer.bos_id, *ids[:75], tokenizer.eos_id]
    end, pad = tokenizer.eos_id, tokenizer.pad_id
    assert second.tokens == [tokenizer.bos_id, *ids[75:], end, *[pad] * 30]
    (truncated,) = prompt_chunks(prompt, tokenizer.tokens, special(tokenizer), truncate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert truncated.tokens == tokenizer([prompt])[0].tolist()  # diffusers' truncation


def test_comma_backtrack(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A chunk that fills up within 20 tokens after a comma moves the words after the comma on."""
    words = ["cat"] * 70 + [","] + ["dog"] * 10
    ids = tokenizer.tokens(" ".join(words))
    assert len(ids) == 81 and ids[70] == special(tokenizer).comma
    first, second = prompt_chunks(" ".join(words), tokenizer.tokens, special(tokenizer))
    # ids[:71] (through the comma) stay; the 4 dogs that fit are moved to the next chunk
    assert first.tokens[1:72] == ids[:71]
    assert first.tokens[72:] == [tokenizer.eos_id] * 5
    assert second.tokens[1:11] == ids[71:]
    nobacktrack = prompt_chunks(" ".join(words), tokenizer.tokens, special(tokenizer), comma_backtrack=0)
    assert nobacktrack[0].tokens[1:76] == ids[:75]


def test_break_starts_a_chunk(tokenizer) -> None:  # type: ignore[no-untyped-def]
    chunks = prompt_chunks("a red cat BREAK a blue dog", tokenizer.tokens, special(tokenizer))
    assert len(chunks) == 2
    assert chunks[0].tokens[:5] == [tokenizer.bos_id, *tokenizer.tokens("a red cat"), tokenizer.eos_id]
    assert chunks[1].tokens[:5] == [tokenizer.bos_id, *tokenizer.tokens("a blue dog"), tokenizer.eos_id]
    assert len(prompt_chunks("", tokenizer.tokens, special(tokenizer))) == 1  # the empty prompt: one chunk


def test_sdxl_pad_token_after_end() -> None:
    """OpenCLIP (SD 2.x, SDXL's tokenizer_2) pads with another id than the end token."""
    ids = SpecialTokens(start=100, end=101, pad=0)
    (chunk,) = prompt_chunks("x", lambda text: [7, 8], ids, chunk_length=5)
    assert chunk.tokens == [100, 7, 8, 101, 0, 0, 0]


def test_encode_chunks_concatenates_and_weights() -> None:
    ids = SpecialTokens(start=1, end=2, pad=2)
    chunks = prompt_chunks("(a:2) b BREAK c", lambda text: [10] if text.strip() else [], ids, chunk_length=3)
    seen: list[list[int]] = []

    def encode(batch: np.ndarray) -> np.ndarray:
        seen.append(batch[0].tolist())
        return np.tile(np.arange(5, dtype=np.float32) + 1.0, (1, batch.shape[1], 1)) + batch[..., None]

    out = encode_chunks(chunks, encode)
    assert out.shape == (1, 10, 5)
    assert seen == [[1, 10, 10, 2, 2], [1, 10, 2, 2, 2]]
    assert np.array_equal(out[:, 5:], encode(np.asarray([seen[1]])))  # unweighted chunk untouched
    padded = pad_chunks(chunks[:1], 3, PromptChunk([1, 2, 2, 2, 2], [1.0] * 5))
    assert len(padded) == 3 and padded[2].tokens == [1, 2, 2, 2, 2]
    with pytest.raises(InputError):
        encode_chunks([], encode)
