"""Base64 images in and out."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from sdkit.errors import InputError
from sdkit_serve.config import Limits
from sdkit_serve.images import decode_image, encode_png


def b64_png(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_round_trip_keeps_pixels_and_parameters() -> None:
    pixels = np.random.default_rng(0).integers(0, 255, (16, 24, 3), dtype=np.uint8)
    encoded = encode_png(Image.fromarray(pixels), "a cat\nSteps: 2, Seed: 1")
    decoded = Image.open(io.BytesIO(base64.b64decode(encoded)))
    assert decoded.info["parameters"] == "a cat\nSteps: 2, Seed: 1"
    assert np.array_equal(np.asarray(decode_image(encoded, "x", Limits())), pixels)
    assert np.array_equal(np.asarray(decode_image(f"data:image/png;base64,{encoded}", "x", Limits())), pixels)


def test_rgba_and_grey_become_rgb() -> None:
    assert decode_image(b64_png(Image.new("RGBA", (8, 8))), "x", Limits()).mode == "RGB"
    assert decode_image(b64_png(Image.new("L", (8, 8))), "x", Limits()).mode == "RGB"


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "base64-encoded image"), ("@@@", "not valid base64"), ("aGVsbG8=", "not a readable image")],
)
def test_bad_images_are_input_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode_image(text, "init_images[0]", Limits())


def test_oversized_images_are_refused_before_decoding() -> None:
    huge = b64_png(Image.new("RGB", (600, 600)))  # compresses to a few kB
    with pytest.raises(InputError, match="limit on image size"):
        decode_image(huge, "mask", Limits(max_width=128, max_height=128))
