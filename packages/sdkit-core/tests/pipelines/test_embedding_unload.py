"""``pipe.unload_embeddings()``: textual-inversion embeddings removed from a pipeline loaded from a
tiny SD 1.x checkpoint.

Oracles: the same pipeline's text-encoder output before any embedding was loaded (all removed:
bit for bit, token ids included), a fresh pipeline with only the embeddings that stay (some
removed: bit for bit), and diffusers' ``load_textual_inversion`` goldens
(``fixtures/families/tiny/sd1/adapters.npz``) for an embedding loaded again after removal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError
from sdkit.families import Family

SD1 = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd1"
PROMPT = "a photo of skstyle and skcat riding a horse"
TOLERANCE = 1e-4


def _load(backend: str) -> Any:
    info = next((b for b in sdkit.backends() if b.name == backend), None)
    if info is None or not info.available:
        pytest.skip(f"backend {backend} unavailable: {info.reason if info else 'not installed'}")
    options = {"threads": 1} if backend == "ggml" else {}
    return sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend=backend, **options)


def _embed(pipe: Any, *names: str) -> None:
    for name in names:
        pipe.load_embedding(SD1 / "embeddings" / f"{name}.safetensors")


@pytest.mark.parametrize("backend", ["reference", "ggml"])
def test_unloading_embeddings_gives_the_base_text_encoder_bit_exactly(
    tiny_families: dict[str, Family], backend: str
) -> None:
    pipe = _load(backend)
    base_ids, base = pipe.tokenizer([PROMPT]), pipe.encode_prompts([PROMPT])
    _embed(pipe, "skstyle", "skcat")
    both = pipe.encode_prompts([PROMPT])
    assert not np.array_equal(both, base)
    pipe.unload_embeddings(["skcat"])
    only_style = _load(backend)
    _embed(only_style, "skstyle")
    assert np.array_equal(pipe.tokenizer([PROMPT]), only_style.tokenizer([PROMPT]))
    assert np.array_equal(pipe.encode_prompts([PROMPT]), only_style.encode_prompts([PROMPT]))
    swaps = pipe.unload_embeddings()
    assert "text_encoder" in swaps and [e.name for e in pipe.adapters.embeddings] == []
    assert np.array_equal(pipe.tokenizer([PROMPT]), base_ids)
    assert np.array_equal(pipe.encode_prompts([PROMPT]), base)


def test_an_embedding_loads_again_after_removal(tiny_families: dict[str, Family]) -> None:
    """Its trigger was a token of the vocabulary until the tokenizers were made afresh."""
    with np.load(SD1 / "adapters.npz", allow_pickle=False) as data:
        golden = data["embeddings/text_encoder/last_hidden_state"]
    pipe = _load("reference")
    _embed(pipe, "skstyle", "skcat")
    pipe.unload_embeddings()
    _embed(pipe, "skstyle", "skcat")
    assert np.abs(pipe.encode_prompts([PROMPT]) - golden).max() <= TOLERANCE


def test_replacing_an_embedding_with_another_vector_count(tiny_families: dict[str, Family]) -> None:
    """``load_embedding(path, name)`` under a loaded name replaces it, whatever its vector count."""
    pipe = _load("reference")
    _embed(pipe, "skstyle", "skcat")
    counts = {e.name: e.count for e in pipe.adapters.embeddings}
    pipe.load_embedding(SD1 / "embeddings" / "skstyle.safetensors", name="skcat")
    assert [(e.name, e.count) for e in pipe.adapters.embeddings] == [
        ("skstyle", counts["skstyle"]),
        ("skcat", counts["skstyle"]),
    ]
    fresh = _load("reference")
    _embed(fresh, "skstyle")
    fresh.load_embedding(SD1 / "embeddings" / "skstyle.safetensors", name="skcat")
    assert np.array_equal(pipe.encode_prompts([PROMPT]), fresh.encode_prompts([PROMPT]))


def test_unloading_what_is_not_loaded_is_one_clear_error(tiny_families: dict[str, Family]) -> None:
    pipe = _load("reference")
    _embed(pipe, "skstyle")
    with pytest.raises(InputError, match=r"no embedding 'skcat' is loaded \(loaded: skstyle\)"):
        pipe.unload_embeddings(["skcat"])
    pipe.unload_embeddings("skstyle")
    with pytest.raises(InputError, match=r"no embedding 'skstyle' is loaded \(loaded: none\)"):
        pipe.unload_embeddings(["skstyle"])
