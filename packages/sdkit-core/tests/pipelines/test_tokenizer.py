"""The CLIP tokenizer against token ids from transformers' CLIPTokenizer (committed golden ids)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.errors import ModelFormatError
from sdkit.pipelines.text.clip_tokenizer import ClipTokenizer, PromptTruncatedWarning


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> ClipTokenizer:
    return ClipTokenizer(tiny_dir / "tokenizer")


def test_ids_match_transformers(tokenizer: ClipTokenizer, golden: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    prompts = meta["tokenizer_prompts"]
    with pytest.warns(PromptTruncatedWarning):  # the last prompt is longer than 77 tokens
        ids = tokenizer(prompts)
    assert ids.shape == (len(prompts), 77)
    np.testing.assert_array_equal(ids, golden["token_ids"])


def test_window_layout(tokenizer: ClipTokenizer) -> None:
    ids = tokenizer("a cat")[0]
    assert ids[0] == tokenizer.bos_id
    assert list(ids[1:3]) == tokenizer.tokens("a cat")
    assert ids[3] == tokenizer.eos_id
    assert (ids[4:] == tokenizer.pad_id).all()


def test_truncation_warns_and_keeps_start_and_end(tokenizer: ClipTokenizer) -> None:
    with pytest.warns(PromptTruncatedWarning, match="ignored"):
        ids = tokenizer(" ".join(["cat"] * 100))[0]
    assert ids[0] == tokenizer.bos_id
    assert ids[-1] == tokenizer.eos_id
    assert (ids[1:-1] == tokenizer.tokens("cat")[0]).all()


def test_pad_token_from_the_folder(tiny_dir: Path, tmp_path: Path) -> None:
    """SD 2.x pads with "!" instead of the end token: the tokenizer folder says which."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_dir / "tokenizer", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["pad_token"] = "!"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = ClipTokenizer(folder)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert tokenizer.pad_id == vocab["!"]
    assert tokenizer("cat")[0, -1] == vocab["!"]


def test_missing_files_are_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match=r"vocab\.json"):
        ClipTokenizer(tmp_path)


@pytest.mark.parametrize(("key", "pad"), [("ids_pad_eos", "<|endoftext|>"), ("ids_pad_bang", "!")])
def test_a_folder_with_clip_s_vocabulary_gives_transformers_ids(tmp_path: Path, key: str, pad: str) -> None:
    """SD 1.x's and SD 2.x's ``tokenizer/`` folders (CLIP's vocabulary; SD 2.x pads with "!"):
    the ids transformers' CLIPTokenizer gives (``fixtures/families/clip_vocab_golden.json``),
    "!" written in a prompt included: transformers splits it off as an added token."""
    import warnings

    from sdkit.families.clip_tokenizer import vocab_and_merges

    vocab, merges = vocab_and_merges()
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": pad}), encoding="utf-8")
    golden_file = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "clip_vocab_golden.json"
    golden = json.loads(golden_file.read_text(encoding="utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptTruncatedWarning)  # two prompts are longer than 77 tokens
        ids = ClipTokenizer(folder)(golden["prompts"])
    expected = np.asarray(golden[key], dtype=np.int64)
    for row, prompt in enumerate(golden["prompts"]):
        np.testing.assert_array_equal(ids[row], expected[row], err_msg=repr(prompt))
