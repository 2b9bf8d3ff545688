"""Images over HTTP: base64 in (PNG, JPEG, WebP, BMP, GIF, TIFF; ``data:`` URLs too), base64 PNG out with the
A1111 ``parameters`` text chunk, so what a client saves reads back like an ``sdkit generate`` file."""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import TYPE_CHECKING

from sdkit.errors import InputError

if TYPE_CHECKING:
    from PIL import Image

    from sdkit_serve.config import Limits

# What clients send; other formats are refused before a decoder looks at them (EPS would run
# Ghostscript, and the rarer decoders raise more kinds of errors on damaged files).
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")
_DATA_URL = re.compile(r"^data:[\w/+.-]*;base64,", re.IGNORECASE)


def decode_image(text: str, what: str, limits: Limits) -> Image.Image:
    """A base64 image as an RGB PIL image, or ``InputError`` naming the field."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(text, str) or not text:
        raise InputError(f"{what} must be a base64-encoded image")
    try:
        raw = base64.b64decode(_DATA_URL.sub("", text.strip()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{what} is not valid base64") from None
    try:
        with Image.open(io.BytesIO(raw), formats=FORMATS) as opened:
            limits.check_pixels(opened.width, opened.height, what)  # before decoding the pixels
            converted: Image.Image = opened.convert("RGB")
            return converted
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(f"{what} is not a readable image (accepted: {', '.join(FORMATS)})") from None
    except Exception as exc:  # a damaged file raises whatever its decoder meets (TypeError, NotImplementedError...)
        raise InputError(f"{what} is not a readable image: {type(exc).__name__}: {exc}") from None


def encode_png(image: Image.Image, parameters: str | None = None) -> str:
    """Base64 PNG, with ``parameters`` in a ``parameters`` text chunk (A1111's infotext)."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    if parameters:
        info.add_text("parameters", parameters)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
