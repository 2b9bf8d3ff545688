"""sdkit's T5 tokenizer against transformers' T5TokenizerFast and Google's sentencepiece.

fixtures/t5_tokenizer/golden.json holds the ids diffusers' SD3/Flux/Chroma pipelines feed T5
(``padding="max_length", truncation=True``, 256 and 512) for varied prompts, from
``T5TokenizerFast`` on FLUX.1's tokenizer folder and, as an independent check, sentencepiece on
its ``spiece.model``. Exact equality is required.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.text.clip_tokenizer import PromptTruncatedWarning
from sdkit.pipelines.text.t5_tokenizer import SHIPPED, SPIECE_SHA256, T5Tokenizer

REPO = Path(__file__).resolve().parents[4]
GOLDEN = REPO / "fixtures" / "t5_tokenizer" / "golden.json"


@lru_cache(maxsize=1)
def golden() -> dict[str, Any]:
    return dict(json.loads(GOLDEN.read_text(encoding="utf-8")))


@lru_cache(maxsize=1)
def shipped() -> T5Tokenizer:
    return T5Tokenizer()


@pytest.mark.parametrize("index", range(len(golden()["cases"])))
def test_ids_match_transformers(index: int) -> None:
    case = golden()["cases"][index]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = shipped()(case["prompt"], max_sequence_length=case["max_sequence_length"])
    assert tokens.input_ids.tolist() == [case["input_ids"]]
    assert tokens.input_ids.dtype == np.int64
    kept = min(case["untruncated_length"], case["max_sequence_length"])
    assert tokens.attention_mask.tolist() == [[1] * kept + [0] * (case["max_sequence_length"] - kept)]
    truncation_warnings = [w for w in caught if issubclass(w.category, PromptTruncatedWarning)]
    assert len(truncation_warnings) == int(case["truncated"])


def test_sentencepiece_agrees_except_for_typed_special_tokens() -> None:
    """The independent oracle: Google's SentencePiece gives the same ids for every prompt but the
    one that types special tokens (one id each for transformers and diffusers)."""
    assert golden()["sentencepiece_differs_on"] == ["special tokens typed in: </s> <pad> <unk> <extra_id_0> done"] * 2
    typed = next(c for c in golden()["cases"] if c["sentencepiece_input_ids"] is not None)
    assert {1, 0, 2, 32099} <= set(typed["input_ids"][:20])  # </s> <pad> <unk> <extra_id_0>


def test_shipped_file_is_the_recorded_one() -> None:
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == (
        "f23c3a8a0659480d106065b1f15087f97b7eabb48d3e100253da7f571585d20c"
    )
    assert (
        golden()["files_sha256"]["tokenizer.json"] == hashlib.sha256(gzip.decompress(SHIPPED.read_bytes())).hexdigest()
    )
    assert golden()["files_sha256"]["spiece.model"] == SPIECE_SHA256
    tok = shipped()
    assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.vocab_size) == (0, 1, 2, 32100)


def test_batch_and_truncation_message() -> None:
    long = " ".join(f"word{i}" for i in range(400))
    with pytest.warns(PromptTruncatedWarning, match="T5 tokens long; the text encoder reads 255"):
        tokens = shipped()(["a cat", long], max_sequence_length=256)
    assert tokens.input_ids.shape == (2, 256)
    assert tokens.input_ids[1, -1] == 1  # the end token survives truncation, as in transformers


def test_folder_with_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(gzip.decompress(SHIPPED.read_bytes()))
    ids = T5Tokenizer(tmp_path)("a photo of an astronaut", max_sequence_length=16).input_ids
    assert ids.tolist() == shipped()("a photo of an astronaut", max_sequence_length=16).input_ids.tolist()


def test_folder_with_only_an_unknown_spiece_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "spiece.model").write_bytes(b"not T5's model")
    with pytest.raises(ModelFormatError, match="not T5's SentencePiece model"):
        T5Tokenizer(tmp_path)
    with pytest.raises(ModelFormatError, match=r"neither tokenizer\.json nor spiece\.model"):
        T5Tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(ModelFormatError, match="cannot be read"):
        T5Tokenizer(tmp_path)
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize("length", [1, 513, True, 2.0])
def test_bad_max_sequence_length(length: Any) -> None:
    with pytest.raises(InputError, match="max_sequence_length"):
        shipped()("a cat", max_sequence_length=length)
