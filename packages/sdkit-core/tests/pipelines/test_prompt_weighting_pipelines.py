"""``prompt_weighting="a1111"`` wired into the SD and SDXL pipelines.

Oracles: the text encoders run with onnxruntime on chunk ids laid out by hand (start token,
tokens, end token, padding: A1111's ``tokenize_line`` layout, documented in ``prompt_chunks``)
or by ``prompt_chunks`` (tested against A1111 in ``test_prompt_weights.py``) for the 75-token
split, and A1111's "Original" emphasis written out here from its definition (``z * w``, then
rescaled to the original mean); diffusers' goldens for prompts that carry no weights.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.pipelines.text.prompt_chunks import prompt_chunks
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
ort = pytest.importorskip("onnxruntime")
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")
LONG = ", ".join(["a photo of an astronaut riding a horse on the moon"] * 8)  # > 75 tokens: 2 chunks


@cache
def session(component: str) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(ROOT / component / "model.onnx"), options, providers=["CPUExecutionProvider"])


def encoder(component: str, ids: list[int], output: str) -> np.ndarray:
    result: np.ndarray = session(component).run([output], {"input_ids": np.asarray([ids], dtype=np.int32)})[0]
    return result


def emphasis(z: np.ndarray, weights: list[float]) -> np.ndarray:
    """A1111's "Original" emphasis (``sd_emphasis.EmphasisOriginal``), from its definition."""
    z = z.astype(np.float32)
    original_mean = z.mean()
    weighted = z * np.asarray(weights, dtype=np.float32)[None, :, None]
    return (weighted * (original_mean / weighted.mean())).astype(np.float32)


def window(pipe: Any, name: str, pieces: list[tuple[str, float]]) -> tuple[list[int], list[float]]:
    """One chunk laid out by hand: [start, tokens..., end, pad...] and its weights."""
    tok = pipe.tokenizers[name]
    ids, weights = [tok.bos_id], [1.0]
    for text, weight in pieces:
        tokens = tok.tokens(text)
        ids += tokens
        weights += [weight] * len(tokens)
    ids += [tok.eos_id] + [tok.pad_id] * (76 - len(ids))
    return ids, weights + [1.0] * (77 - len(weights))


def conditioning(pipe: Any, prompt: str, **fields: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    plan = pipe.plan(pipe.accept(pipe.request_class.create(prompt, width=48, height=32, **fields)))
    return pipe.conditioning(plan), plan.parameters


@pytest.fixture(scope="module")
def sd() -> Any:
    return sdkit.load_pipeline(ROOT / "sd15", backend="reference", threads=1)


@pytest.fixture(scope="module")
def xl() -> Any:
    return sdkit.load_pipeline(ROOT / "sdxl", backend="reference", threads=1)


def test_sd_weights_are_a1111_emphasis(sd: Any) -> None:
    """Each token's state times its weight, then one common factor. The factor itself
    (mean before / mean after) is checked in the SDXL test: this tiny CLIP's final LayerNorm has
    zero bias, so its output's mean is float32 rounding noise (~1e-9) and so is the factor."""
    feeds, labels = conditioning(
        sd, "a (red:1.5) cat on [the] moon", negative_prompt="blurry", prompt_weighting="a1111"
    )
    pieces = [("a ", 1.0), ("red", 1.5), (" cat on ", 1.0), ("the", 1 / 1.1), (" moon", 1.0)]
    ids, weights = window(sd, "text_encoder", pieces)
    weighted = encoder("sd15/text_encoder", ids, "last_hidden_state") * np.asarray(weights, np.float32)[None, :, None]
    got = feeds["encoder_hidden_states"][1:]
    factor = float((got * weighted).sum() / (weighted * weighted).sum())  # least squares
    assert np.abs(got - factor * weighted).max() <= 1e-4 * max(1.0, abs(factor))
    negative = encoder("sd15/text_encoder", window(sd, "text_encoder", [("blurry", 1.0)])[0], "last_hidden_state")
    assert np.abs(feeds["encoder_hidden_states"][:1] - negative).max() <= 1e-5  # no weights: untouched
    assert labels == {}  # A1111's default emphasis: no label


def test_sd_long_prompt_is_chunked_and_the_negative_padded(sd: Any) -> None:
    feeds, labels = conditioning(sd, LONG, negative_prompt="blurry", prompt_weighting="a1111")
    tok = sd.tokenizers["text_encoder"]
    ids = prompt_chunks(LONG, tok.tokens, sd.text_encoder("text_encoder").special_tokens())
    assert len(ids) == 2
    positive = np.concatenate([encoder("sd15/text_encoder", c.tokens, "last_hidden_state") for c in ids], axis=1)
    empty = encoder("sd15/text_encoder", window(sd, "text_encoder", [])[0], "last_hidden_state")
    negative = encoder("sd15/text_encoder", window(sd, "text_encoder", [("blurry", 1.0)])[0], "last_hidden_state")
    expected = np.concatenate([np.concatenate([negative, empty], axis=1), positive])
    assert feeds["encoder_hidden_states"].shape == (2, 154, 32)
    assert np.abs(feeds["encoder_hidden_states"] - expected).max() <= 1e-5
    assert labels == {"Pad conds": "True"}


def test_default_truncates_and_says_emphasis_none(sd: Any) -> None:
    with pytest.warns(UserWarning, match="the text encoder reads 75"):
        feeds, _ = conditioning(sd, LONG, guidance_scale=1.0)
    assert feeds["encoder_hidden_states"].shape == (1, 77, 32)
    _, labels = conditioning(sd, "a (red:1.5) cat")
    assert labels == {"Emphasis": "None"}


def test_sdxl_two_encoders_weighted_and_zero_negative(xl: Any) -> None:
    """Each encoder's penultimate states weighted on their own, concatenated on features; pooled
    from the first chunk of text_encoder_2, unweighted; an empty negative is zeros in its first
    window and the empty prompt's chunk after it (A1111's zeroed negative, padded)."""
    feeds, labels = conditioning(xl, LONG + ", (red:1.3) cat", prompt_2="a (blue:0.7) dog", prompt_weighting="a1111")
    tok1 = xl.text_encoder("text_encoder")
    first = prompt_chunks(LONG + ", (red:1.3) cat", tok1.tokenizer.tokens, tok1.special_tokens())
    assert len(first) == 2
    hidden_1 = np.concatenate(
        [emphasis(encoder("sdxl/text_encoder", c.tokens, "hidden_states.4"), c.weights) for c in first], axis=1
    )
    ids_2, weights_2 = window(xl, "text_encoder_2", [("a ", 1.0), ("blue", 0.7), (" dog", 1.0)])
    empty_2 = window(xl, "text_encoder_2", [])[0]
    hidden_2 = np.concatenate(
        [
            emphasis(encoder("sdxl/text_encoder_2", ids_2, "hidden_states.4"), weights_2),
            encoder("sdxl/text_encoder_2", empty_2, "hidden_states.4"),
        ],
        axis=1,
    )
    positive = np.concatenate([hidden_1, hidden_2], axis=-1)
    empty = np.concatenate(
        [
            encoder("sdxl/text_encoder", window(xl, "text_encoder", [])[0], "hidden_states.4"),
            encoder("sdxl/text_encoder_2", empty_2, "hidden_states.4"),
        ],
        axis=-1,
    )
    negative = np.concatenate([np.zeros_like(empty), empty], axis=1)
    assert feeds["encoder_hidden_states"].shape == (2, 154, 64)
    assert np.abs(feeds["encoder_hidden_states"] - np.concatenate([negative, positive])).max() <= 1e-5
    pooled = encoder("sdxl/text_encoder_2", ids_2, "text_embeds")
    assert np.abs(feeds["text_embeds"] - np.concatenate([np.zeros_like(pooled), pooled])).max() <= 1e-5
    assert labels == {"Pad conds": "True"}


def test_unweighted_short_prompts_keep_diffusers_images(xl: Any) -> None:
    """Without brackets and within 75 tokens, A1111's way is diffusers' way: the goldens hold."""
    expected, case = GOLDENS.array("sdxl_euler/image"), GOLDENS.case("sdxl_euler")
    sizes = ("original_size", "crops_coords_top_left", "target_size", "negative_original_size")
    sizes += ("negative_crops_coords_top_left", "negative_target_size")
    image = xl.generate(
        case["prompt"],
        prompt_2=case["prompt_2"],
        negative_prompt=case["negative_prompt"],
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        sampler=case["sampler"],
        width=48,
        height=32,
        output_type="np",
        prompt_weighting="a1111",
        **{k: case[k] for k in sizes},
    )
    assert np.abs(image - expected).max() <= 1e-3
