"""A video's frames as an animated WebP and PNGs (``sdkit.pipelines.imaging.video``): every frame
comes back from Pillow pixel for pixel (lossless), at the frame rate asked, with A1111's parameters
in each PNG's text chunk and in the WebP's EXIF UserComment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sdkit.errors import InputError
from sdkit.pipelines.imaging.images import GenerationParameters
from sdkit.pipelines.imaging.video import read_webp_parameters, save_video

PARAMETERS = GenerationParameters("a boat", "fog", 4, "euler", "normal", 5.0, 7, 24, 16, "wan2.2-ti2v-5b")


def test_frames_round_trip_through_pillow(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 256, (16, 24, 3), np.uint8)) for _ in range(5)]
    webp, pngs = save_video(frames, tmp_path / "out" / "00001-7.png", PARAMETERS, fps=8)
    assert webp == tmp_path / "out" / "00001-7.webp"
    assert [p.name for p in pngs] == [f"00001-7-frame-{i:03d}.png" for i in range(5)]
    with Image.open(webp) as video:
        assert (video.format, video.n_frames, video.is_animated) == ("WEBP", 5, True)
        for index, frame in enumerate(frames):
            video.seek(index)
            pixels = np.asarray(video.convert("RGB"))  # loads the frame, and with it its duration
            assert video.info["duration"] == 125  # 8 fps
            assert np.array_equal(pixels, np.asarray(frame))
    text = read_webp_parameters(webp)
    assert text is not None and text.startswith("a boat\nNegative prompt: fog\nSteps: 4")
    assert "Seed: 7, Size: 24x16" in text and "Frames: 5, FPS: 8" in text
    for index, (png, frame) in enumerate(zip(pngs, frames, strict=True)):
        with Image.open(png) as image:
            assert np.array_equal(np.asarray(image), np.asarray(frame))
            assert (
                f"Seed: 7, Size: 24x16, Model: wan2.2-ti2v-5b, Frame: {index + 1}/5, FPS: 8" in image.info["parameters"]
            )


def test_bad_video_arguments(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="at least one frame"):
        save_video([], tmp_path / "v.webp", PARAMETERS, fps=8)
    with pytest.raises(InputError, match="fps must be at least 1"):
        save_video([Image.new("RGB", (8, 8))], tmp_path / "v.webp", PARAMETERS, fps=0)
    assert read_webp_parameters(_plain_webp(tmp_path)) is None


def _plain_webp(tmp_path: Path) -> Path:
    path = tmp_path / "plain.webp"
    Image.new("RGB", (8, 8)).save(path, format="WEBP")
    return path
