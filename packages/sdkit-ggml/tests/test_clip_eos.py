"""CLIP text encoders pooling at the first end token, ``argmax((input_ids == eos_token_id).int())``
(an Equal on integer ids), on ggml (``fixtures/clip_eos``, README there).

Oracles: transformers' outputs recorded by ``fixtures/clip_eos/make_clip_eos.py`` (and
onnxruntime on the same graphs); for the SDXL pipeline whose two encoders take that path,
diffusers' golden image and per-step latents of ``fixtures/tiny_xl`` (``sdxl_euler``).
"""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError
from sdkit.model import load_onnx
from sdkit.testing.goldens import GoldenSet, StepRecorder

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
ROOT = FIXTURES / "clip_eos"
ENCODERS = ("clip_legacy", "clip_eos49407", "sdxl_text_encoder", "sdxl_text_encoder_2")
TOLERANCE = 1e-5  # max |diff| / max(1, |want|): F32 sums in another order than torch
pytestmark = pytest.mark.skipif(not (ROOT / "goldens.npz").is_file(), reason="fixtures/clip_eos missing")


@cache
def goldens() -> dict[str, np.ndarray]:
    with np.load(ROOT / "goldens.npz") as data:
        return {k: data[k] for k in data.files}


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_matches_transformers(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = ROOT / name / "model.onnx"
    ids = goldens()[f"{name}/in/input_ids"]
    compiled = sdkit.compile(load_onnx(path), backend="ggml", threads=1)
    got = compiled.run({"input_ids": ids})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"input_ids": ids}), strict=True))
    for output, value in got.items():
        want = goldens()[f"{name}/out/{output}"]
        assert scaled_error(value, want) <= TOLERANCE, (name, output)
        assert scaled_error(value, theirs[output]) <= TOLERANCE, (name, output, "onnxruntime")


def test_token_ids_are_range_checked_per_run() -> None:
    # the ids feed an Equal computed in F32 and the embedding Gather: out-of-vocabulary ids and
    # negatives (which a Gather alone would wrap) are refused, never compared wrongly
    compiled = sdkit.compile(load_onnx(ROOT / "clip_eos49407" / "model.onnx"), backend="ggml", threads=1)
    ids = goldens()["clip_eos49407/in/input_ids"].copy()
    for bad in (49408, -1, 1 << 30):
        ids[0, 3] = bad
        with pytest.raises(InputError, match="input_ids"):
            compiled.run({"input_ids": ids})


def test_sdxl_pipeline_with_eos_pooling_encoders_matches_diffusers(tmp_path: Path) -> None:
    """tiny_xl's SDXL folder with both text encoders re-exported to pool through the Equal path
    (same weights; the end token is the vocabulary's highest id, so diffusers' golden holds)."""
    xl = FIXTURES / "tiny_xl"
    folder = tmp_path / "sdxl"
    shutil.copytree(xl / "sdxl", folder)  # copies: the loader refuses links leaving a folder
    for name in ("text_encoder", "text_encoder_2"):
        shutil.rmtree(folder / name)
        shutil.copytree(ROOT / f"sdxl_{name}", folder / name)
    goldens_xl = GoldenSet(xl)
    case = goldens_xl.case("sdxl_euler")
    pipe = sdkit.load_pipeline(folder, backend="ggml", threads=1)
    try:
        steps = StepRecorder()
        sizes = ("original_size", "crops_coords_top_left", "target_size")
        kwargs = {name: case[name] for name in (*sizes, *(f"negative_{s}" for s in sizes))}
        image = pipe.generate(
            case["prompt"],
            prompt_2=case["prompt_2"],
            negative_prompt=case["negative_prompt"],
            seed=case["seed"],
            steps=case["steps"],
            guidance_scale=case["guidance_scale"],
            sampler=case["sampler"],
            width=case["width"],
            height=case["height"],
            output_type="np",
            callback=steps,
            **kwargs,
        )
        goldens_xl.check("sdxl_euler", image, steps, (1e-3, 1e-4), "ggml, Equal-pooling encoders")
        assert set(pipe.backends().values()) - {None} == {"ggml"}
    finally:
        pipe.close()
