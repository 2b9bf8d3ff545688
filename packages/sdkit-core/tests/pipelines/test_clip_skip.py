"""Clip skip (A1111's "Clip skip", diffusers' ``clip_skip`` + 1) against diffusers' text
embeddings of the same tiny torch encoders (``fixtures/tiny_xl/make_clip_skip_goldens.py``), on
SD 1.5 (the final layer norm after the skipped layers) and SDXL (two encoders' earlier hidden
layers, the pooled embedding unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, UnsupportedFeatureError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.models.flow import FlowPipeline
from sdkit.pipelines.text.text_encoding import encode_prompts

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
GOLDENS = ROOT / "clip_skip.npz"
PROMPT = "a photo of an astronaut riding a horse"  # make_clip_skip_goldens.PROMPT
pytestmark = pytest.mark.skipif(not GOLDENS.is_file(), reason="fixtures/tiny_xl/clip_skip.npz missing")


@pytest.fixture(scope="module")
def goldens() -> Any:
    with np.load(GOLDENS) as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def sd15() -> Any:
    return sdkit.load_pipeline(ROOT / "sd15", backend="reference")


@pytest.mark.parametrize("skip", [1, 2, 3])
def test_sd15_clip_skip_equals_diffusers(goldens: Any, sd15: Any, skip: int) -> None:
    pipe = sd15
    [embeddings], _ = encode_prompts([pipe.text_encoder("text_encoder", skip)], [[PROMPT]], "none")
    expected = goldens[f"sd15/clip_skip_{skip - 1}/prompt_embeds"]
    assert float(np.abs(embeddings.hidden - expected).max()) <= 1e-5


@pytest.mark.parametrize("skip", [1, 2, 3])
def test_sdxl_clip_skip_equals_diffusers(goldens: Any, skip: int) -> None:
    pipe = sdkit.load_pipeline(ROOT / "sdxl", backend="reference")
    encoders = [pipe.text_encoder(name, skip) for name in ("text_encoder", "text_encoder_2")]
    embeddings, _ = encode_prompts(encoders, [[PROMPT], [PROMPT]], "none")
    hidden = np.concatenate([e.hidden for e in embeddings], axis=-1)
    assert float(np.abs(hidden - goldens[f"sdxl/clip_skip_{skip - 1}/prompt_embeds"]).max()) <= 1e-5
    pooled = goldens[f"sdxl/clip_skip_{skip - 1}/pooled_prompt_embeds"]
    assert float(np.abs(embeddings[1].pooled - pooled).max()) <= 1e-5


def test_clip_skip_in_generate(sd15: Any) -> None:
    """The request field reaches the encoder; going back to 1 gives the image without, bit for
    bit (the encoder's graph goes back to the source's); too many layers is one InputError."""
    pipe = sd15
    settings = {"seed": 1, "steps": 2, "width": 32, "height": 32, "sampler": "euler", "output_type": "np"}
    plain = pipe.generate("a cat", **settings)
    skipped = pipe.generate("a cat", clip_skip=2, **settings)
    assert float(np.abs(plain - skipped).max()) > 1e-3
    assert np.array_equal(pipe.generate("a cat", **settings), plain)
    with pytest.raises(InputError, match="clip_skip 9 is more than this text encoder's 5 layers"):
        pipe.generate("a cat", clip_skip=9, **settings)
    with pytest.raises(InputError, match="clip_skip must be an integer >= 1"):
        GenerationRequest.create("a cat", clip_skip=0)
    with pytest.raises(UnsupportedFeatureError, match="clip skip"):
        FlowPipeline.refuse_unsupported(GenerationRequest.create("a cat", clip_skip=2))


def test_cli_clip_skip(sd15: Any, tmp_path: Path) -> None:
    """``sdkit generate --clip-skip 2`` is the API's ``clip_skip=2``; the PNG says so, as A1111."""
    from PIL import Image

    from sdkit.cli.main import main

    out = tmp_path / "skip.png"
    argv = ["generate", "a cat", "--model", str(ROOT / "sd15"), "--backend", "reference", "--clip-skip", "2"]
    argv += ["--steps", "2", "--seed", "3", "--sampler", "euler", "--width", "32", "--height", "32", "--cfg", "7.5"]
    assert main([*argv, "-o", str(out)]) == 0
    expected = sd15.generate("a cat", clip_skip=2, steps=2, seed=3, sampler="euler", width=32, height=32)[0]
    with Image.open(out) as image:
        assert np.array_equal(np.asarray(image), np.asarray(expected))
        assert "Clip skip: 2" in image.info["parameters"]
