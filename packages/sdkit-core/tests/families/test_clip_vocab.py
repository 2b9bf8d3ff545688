"""The shipped CLIP vocabulary against transformers' CLIPTokenizer (committed golden ids)."""

from __future__ import annotations

import gzip
import hashlib
import json
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.families.clip_tokenizer import BOS, EOS, VOCAB_SIZE, ShippedClipTokenizer, bytes_to_unicode, vocab_and_merges


@pytest.fixture(scope="module")
def golden(families_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((families_dir / "clip_vocab_golden.json").read_text(encoding="utf-8"))
    return data


def test_shipped_file_is_the_documented_one() -> None:
    folder = resources.files("sdkit.families").joinpath("clip_vocab")
    data = folder.joinpath("bpe_simple_vocab_16e6.txt.gz").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"
    assert gzip.decompress(data).startswith(b'"bpe_simple_vocab_16e6.txt#version: 0.2\n')
    assert "MIT" in folder.joinpath("PROVENANCE.md").read_text(encoding="utf-8")
    assert "Permission is hereby granted" in folder.joinpath("LICENSE").read_text(encoding="utf-8")


def test_vocabulary_layout() -> None:
    vocab, merges = vocab_and_merges()
    assert len(vocab) == VOCAB_SIZE == 49408 and len(merges) == 48894
    assert vocab[BOS] == 49406 and vocab[EOS] == 49407
    assert vocab["!"] == 0 and vocab["!</w>"] == 256  # SD 2.x pads with id 0
    assert len(set(bytes_to_unicode().values())) == 256


def test_known_sd_ids() -> None:
    # Widely published ids of SD's tokenizer: an anchor independent of any golden file.
    ids = ShippedClipTokenizer()("a photo of a cat")[0]
    assert list(ids[:8]) == [49406, 320, 1125, 539, 320, 2368, 49407, 49407]


@pytest.mark.parametrize(("key", "pad"), [("ids_pad_eos", EOS), ("ids_pad_bang", "!")])
def test_ids_match_transformers(golden: dict[str, Any], key: str, pad: str) -> None:
    tokenizer = ShippedClipTokenizer(pad_token=pad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two prompts are longer than 77 tokens
        ids = tokenizer(golden["prompts"])
    expected = np.asarray(golden[key], dtype=np.int64)
    for row, prompt in enumerate(golden["prompts"]):
        np.testing.assert_array_equal(ids[row], expected[row], err_msg=repr(prompt))
