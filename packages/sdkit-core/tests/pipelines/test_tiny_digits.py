"""The trained tiny_digits model draws the digit its prompt names, through the code that runs SD.

``models/tiny-digits/tiny_digits.safetensors`` (trained by ``tools/train_tiny_digits.py`` on
scikit-learn's ``load_digits``; model card beside it) loads like any SD 1.x single file. The
oracle is independent of sdkit and of the model: a scikit-learn classifier trained here on
``load_digits`` (the 8x8 images the model learnt from, 0-16 ink scale). Each generated 32 px
image is reduced to 8x8 the way those images look (4x4 block means of the ink, dark ink on white
turned into 0-16 ink) and classified. A noise image, or a model that ignored its prompt, cannot
pass: the ten prompts share one seed, so the same initial noise must become ten different digits,
each the one named; with an empty prompt the same seeds do not give the digits.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import sdkit
from sdkit.families import Checkpoint, describe, detect
from sdkit.families.builtin import SD1
from sdkit.families.family import initializer_specs
from sdkit.families.tiny_digits import TINY_DIGITS

ROOT = Path(__file__).resolve().parents[4]
MODEL = ROOT / "models" / "tiny-digits" / "tiny_digits.safetensors"
TINY = ROOT / "fixtures" / "families" / "tiny"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SEED = 1
REQUEST: dict[str, Any] = {"steps": 6, "guidance_scale": 5.0, "sampler": "euler", "seed": SEED, "output_type": "np"}


@lru_cache(maxsize=1)
def classifier() -> Any:
    sklearn = pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    assert sklearn.__version__
    data = load_digits()
    return SVC(gamma=0.001).fit(data.data, data.target)


def to_8x8(image: np.ndarray) -> np.ndarray:
    """[H, W, 3] in [0, 1] (dark ink on white) -> load_digits' 64 features (ink, 0-16)."""
    ink = 1.0 - image.mean(axis=2)
    h, w = ink.shape
    return np.clip(ink.reshape(8, h // 8, 8, w // 8).mean(axis=(1, 3)) * 16.0, 0, 16).reshape(64)


def classify(images: list[np.ndarray]) -> list[int]:
    return [int(d) for d in classifier().predict(np.stack([to_8x8(i) for i in images]))]


def _backend(name: str) -> None:
    info = next((b for b in sdkit.backends() if b.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"backend {name} unavailable: {info.reason if info else 'not installed'}")


@lru_cache(maxsize=3)
def pipeline(backend: str) -> Any:
    # One thread: the model is tiny, and a thread pool that spins on a loaded 2-core runner is
    # 10-100x slower than one thread (ggml measured 30 s per image with its default, 0.2 s with 1).
    return sdkit.load_pipeline(MODEL, backend=backend, threads=1)


def draw(backend: str, prompt: str, **kwargs: Any) -> np.ndarray:
    [image] = pipeline(backend).generate(prompt, **{**REQUEST, **kwargs})
    return np.asarray(image)


def digit_image(digit: int) -> Image.Image:
    """The first load_digits image of ``digit`` at 32 px (4x4 cells), dark ink on white."""
    from sklearn.datasets import load_digits

    data = load_digits()
    ink = np.kron(data.images[list(data.target).index(digit)] / 16.0, np.ones((4, 4)))
    return Image.fromarray(np.repeat(((1.0 - ink) * 255).round().astype(np.uint8)[:, :, None], 3, axis=2))


def test_the_file_is_a_small_ldm_single_file_detected_as_tiny_digits() -> None:
    assert MODEL.stat().st_size <= 10_000_000
    checkpoint = Checkpoint.open(MODEL)
    found = detect(checkpoint, [SD1, TINY_DIGITS])
    assert (found.family.name, found.layout, found.prediction_type) == ("tiny_digits", "ldm", "epsilon")
    assert SD1.detect(checkpoint) is None  # not mistaken for SD 1.x
    assert TINY_DIGITS.detect(Checkpoint.open(TINY / "sd1" / "sd1_fp16.safetensors")) is None  # nor SD 1.x for it
    assert any(k.startswith("model.diffusion_model.input_blocks.") for k in checkpoint)
    assert "tiny_digits" in describe(checkpoint, [SD1, TINY_DIGITS]).summary()


def test_every_graph_initializer_has_a_key_in_each_layout() -> None:
    for component in TINY_DIGITS.components:
        specs = initializer_specs(TINY_DIGITS.components[component].load_graph())
        for layout in TINY_DIGITS.layouts():
            assert set(TINY_DIGITS.key_map(component, layout)) == set(specs)


def test_the_classifier_oracle_reads_the_training_data_as_digits() -> None:
    """The reduction is load_digits' own: its 8x8 cells count the ink of 4x4 blocks of 32x32
    bitmaps. The data set's images drawn at 32 px come back classified as their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    ink = [np.kron(i / 16.0, np.ones((4, 4))) for i in data.images[:200]]
    images = [np.repeat((1.0 - i)[:, :, None], 3, axis=2) for i in ink]
    assert np.mean(np.array(classify(images)) == data.target[:200]) > 0.97


BACKENDS = [
    pytest.param("ggml", id="ggml"),
    pytest.param("openvino", id="openvino"),
    # ~8 s (38 s on a loaded runner): numpy, node by node
    pytest.param("reference", id="reference", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_prompt_draws_its_digit(backend: str) -> None:
    """Ten prompts, one seed (the same initial noise): at least 9 of 10 images are classified
    as the digit named."""
    _backend(backend)
    images = [draw(backend, f"a handwritten digit {word}") for word in WORDS]
    assert images[0].shape == (32, 32, 3)
    predicted = classify(images)
    correct = sum(p == d for d, p in enumerate(predicted))
    assert correct >= 9, f"{backend}: prompts 0-9 classified {predicted}"


def test_the_text_conditioning_chooses_the_digit() -> None:
    """Negative controls. Swapped conditioning: the prompt's text as the negative prompt and an
    empty prompt (CFG then steers away from the digit): no image is classified as that digit
    (measured: none of ten). One noise, ten texts: at one seed the empty prompt draws one digit,
    and the ten prompts draw all ten, so the text, not the noise, chose them."""
    _backend("openvino")
    swapped = classify([draw("openvino", "", negative_prompt=f"a handwritten digit {word}") for word in WORDS])
    assert sum(p == d for d, p in enumerate(swapped)) <= 1, swapped
    [unconditional] = classify([draw("openvino", "")])
    prompted = classify([draw("openvino", f"a handwritten digit {word}") for word in WORDS])
    assert sorted(prompted) == list(range(10)), (unconditional, prompted)


@pytest.mark.parametrize("sampler", ["euler_a", "heun", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde", "ddim", "lcm"])
def test_every_sampler_draws_the_digits(sampler: str) -> None:
    """euler is the request above; the other SD samplers (DDIM and LCM included) on the model's
    scaled-linear betas, 6 steps, CFG 5."""
    _backend("openvino")
    predicted = classify([draw("openvino", f"a handwritten digit {word}", sampler=sampler) for word in WORDS])
    assert sum(p == d for d, p in enumerate(predicted)) >= 9, f"{sampler}: {predicted}"


def test_img2img_keeps_the_image_at_low_strength_and_follows_the_prompt_at_high() -> None:
    _backend("openvino")
    three = digit_image(3)
    assert classify([np.asarray(three) / 255.0]) == [3]
    low = draw("openvino", "a handwritten digit eight", init_image=three, strength=0.3)
    high = [draw("openvino", f"a handwritten digit {w}", init_image=three, strength=0.7) for w in ("eight", "three")]
    assert classify([low, *high]) == [3, 8, 3]


def test_inpainting_redraws_the_masked_part_and_keeps_the_rest() -> None:
    _backend("openvino")
    three = digit_image(3)
    everything = np.full((32, 32), 255, np.uint8)
    redrawn = [
        draw("openvino", f"a handwritten digit {w}", init_image=three, mask=everything) for w in ("eight", "zero")
    ]
    assert classify(redrawn) == [8, 0]
    right = np.zeros((32, 32), np.uint8)
    right[:, 16:] = 255
    half = draw("openvino", "a handwritten digit eight", init_image=three, mask=right, paste_back=True)
    original = np.asarray(three) / 255.0
    assert np.abs(half[:, :16] - original[:, :16]).max() <= 1 / 255
    assert np.abs(half[:, 16:] - original[:, 16:]).max() > 0.2
