"""VAE tiling wired into the pipelines (``vae_tiling``, ``--vae-tiling``): the tiled stages
against an independent oracle, onnxruntime running the same VAE graphs tile by tile and
``sdkit.pipelines.stages.tiling`` blending them (its blend math has its own tests, ``test_tiling.py``),
within 1e-5; and against the untiled stages, the gap reported (a real VAE differs near tile
borders: less context, per-tile GroupNorm statistics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.stages.tiling import tiled_decode, tiled_encode

ort = pytest.importorskip("onnxruntime")
SD15 = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl" / "sd15"
pytestmark = pytest.mark.skipif(not (SD15 / "model_index.json").is_file(), reason="fixtures/tiny_xl missing")
SIZE = 48  # image pixels; the tiny VAE's factor is 2: latents 24 x 24
TILE = 16  # pixels: 8 latents per tile, overlap 4 pixels = 2 latents -> 4 x 4 tiles


@pytest.fixture(scope="module")
def pipe() -> Any:
    loaded = sdkit.load_pipeline(SD15, backend="reference")
    yield loaded
    loaded.close()


def session(component: str) -> Any:
    return ort.InferenceSession(str(SD15 / component / "model.onnx"), providers=["CPUExecutionProvider"])


def ort_decode(latents: np.ndarray, tile: int | None) -> np.ndarray:
    """The oracle: onnxruntime's decoder on the unscaled latents, whole or tiled, to [0, 1] NHWC."""
    decoder = session("vae_decoder")
    name = decoder.get_inputs()[0].name
    unscaled = (latents / np.float32(0.18215)).astype(np.float32)

    def one(part: np.ndarray) -> np.ndarray:
        return np.asarray(decoder.run(["sample"], {name: part})[0], dtype=np.float32)

    out = one(unscaled) if tile is None else tiled_decode(unscaled, one, tile // 2, 2)
    return np.clip(out / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)


def test_tiled_decode_is_the_blend_of_the_tiles(pipe: Any) -> None:
    latents = np.random.default_rng(0).standard_normal((2, 4, SIZE // 2, SIZE // 2)).astype(np.float32)
    tiled = pipe.decode(latents, TILE)
    np.testing.assert_allclose(tiled, ort_decode(latents, TILE), atol=1e-5)
    whole = pipe.decode(latents)
    np.testing.assert_allclose(whole, ort_decode(latents, None), atol=1e-5)
    gap = float(np.abs(tiled - whole).max())
    print(f"tiny VAE, {SIZE} px in {TILE} px tiles: max |tiled - untiled| = {gap:.3g}")
    assert 0.0 < gap < 0.5  # the tiles see less context than the whole: close, not equal


def test_generate_with_vae_tiling_decodes_the_same_latents_in_tiles(pipe: Any) -> None:
    kept: list[np.ndarray] = []
    common: dict[str, Any] = {
        "seed": 3,
        "steps": 2,
        "sampler": "euler",
        "width": SIZE,
        "height": SIZE,
        "output_type": "np",
    }
    tiled = pipe.generate(
        "a house", **common, vae_tiling=True, vae_tile_size=TILE, callback=lambda i, n, x: kept.append(x)
    )
    np.testing.assert_allclose(tiled, ort_decode(kept[-1], TILE), atol=1e-5)
    untiled = pipe.generate("a house", **common)
    np.testing.assert_allclose(untiled, ort_decode(kept[-1], None), atol=1e-5)


def test_img2img_encodes_in_tiles(pipe: Any) -> None:
    """The encoder's posterior parameters come from tiles: the img2img result with ``strength`` 1
    ignores the image, so compare the encoder stage itself, then a real img2img against it."""
    from sdkit.pipelines.stages import vae
    from sdkit.pipelines.stages.rng import NoiseStream

    image = np.linspace(-1, 1, 3 * SIZE * SIZE, dtype=np.float32).reshape(1, 3, SIZE, SIZE)
    encoder = session("vae_encoder")
    name = encoder.get_inputs()[0].name

    def one(part: np.ndarray) -> np.ndarray:
        return np.asarray(encoder.run(None, {name: part})[0], dtype=np.float32)

    params = tiled_encode(image, one, TILE, 4, factor=2)
    mean, logvar = params[:, :4], np.clip(params[:, 4:], -30.0, 20.0)
    draw = NoiseStream([5]).normal(mean.shape)
    expected = (mean + np.exp(0.5 * logvar) * draw) * np.float32(0.18215)
    got = vae.encode(pipe.components["vae_encoder"], image, NoiseStream([5]), 1, pipe.config, TILE)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_vae_tiling_options_are_checked() -> None:
    with pytest.raises(InputError, match="vae_tiling"):
        GenerationRequest.create("x", vae_tiling="yes")
    with pytest.raises(InputError, match="vae_tile_size"):
        GenerationRequest.create("x", vae_tiling=True, vae_tile_size=12)


def test_cli_vae_tiling_writes_the_tiled_image(tmp_path: Path) -> None:
    from PIL import Image

    from sdkit.cli.main import main

    out = tmp_path / "tiled.png"
    argv = ["generate", "a house", "-m", str(SD15), "-o", str(out), "--steps", "2", "--seed", "3"]
    argv += ["--sampler", "euler", "--width", str(SIZE), "--height", str(SIZE), "--backend", "reference"]
    argv += ["--cfg", "7.5"]  # the API's default guidance_scale, which the expected image is made with
    assert main([*argv, "--tile", "--vae-tile-size", str(TILE)]) == 0  # --tile: --vae-tiling's alias
    with Image.open(out) as image:
        written = np.asarray(image, dtype=np.float32) / 255
    kept: list[np.ndarray] = []
    pipe = sdkit.load_pipeline(SD15, backend="reference")
    pipe.generate("a house", seed=3, steps=2, sampler="euler", width=SIZE, height=SIZE, output_type="np",
                  callback=lambda i, n, x: kept.append(x))  # fmt: skip
    assert np.abs(written - ort_decode(kept[-1], TILE)[0]).max() <= 1 / 255 + 1e-6  # the PNG's rounding


def test_cli_tile_size_needs_tiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdkit.cli.main import main

    argv = ["generate", "x", "-m", str(SD15), "-o", str(tmp_path / "x.png"), "--vae-tile-size", "256"]
    assert main(argv) == 1
    assert capsys.readouterr().err.strip() == "sdkit: error: --vae-tile-size needs --vae-tiling"
