"""VAE tiling on the flow pipelines (SD3, Flux, Chroma: ``vae_tiling``, ``--vae-tiling``), checked
as the SD pipelines' tiling is (``test_vae_tiling.py``): the oracle is onnxruntime running the
same 16-channel VAE graphs tile by tile, the latents unscaled and shifted as diffusers'
``latents / scaling_factor + shift_factor`` with the numbers read from the folder's
``vae_decoder/config.json``, blended by ``sdkit.pipelines.stages.tiling`` (its blend math has its own
tests, ``test_tiling.py``), within 1e-5. Untiled, the same stages are diffusers' (the goldens of
``test_flow_pipelines.py``); tiled, sdkit's blend is not diffusers' ``enable_tiling`` blend (the
SD pipelines' tiled images, which must stay bit-identical, use it too), so the oracle is the
tile-by-tile run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.pipelines.models.flux_latents import pack
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.stages.tiling import tiled_decode, tiled_encode

ort = pytest.importorskip("onnxruntime")
FLOW = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
pytestmark = pytest.mark.skipif(not (FLOW / "golden.json").is_file(), reason="fixtures/tiny_flow missing")
FAMILIES = ("sd3", "flux_dev", "chroma")
TILE = 16  # pixels: the tiny VAE's factor is 2, so 8 latents per tile, overlap 4 pixels = 2 latents
FACTOR = 2
COMMON: dict[str, Any] = {"seed": 5, "steps": 2, "width": 48, "height": 32, "output_type": "np"}
COMMON["max_sequence_length"] = 32


@pytest.fixture(scope="module")
def pipes() -> Any:
    loaded = {name: sdkit.load_pipeline(FLOW / name, backend="reference") for name in FAMILIES}
    yield loaded
    for pipe in loaded.values():
        pipe.close()


def vae_numbers(family: str) -> tuple[float, float]:
    config = json.loads((FLOW / family / "vae_decoder" / "config.json").read_text())
    return float(config["scaling_factor"]), float(config["shift_factor"])


def session(family: str, component: str) -> Any:
    path = FLOW / family / component / "model.onnx"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def ort_decode(family: str, latents: np.ndarray, tile: int | None) -> np.ndarray:
    """The oracle: onnxruntime's decoder on ``latents / scaling + shift``, whole or tiled, [0, 1] NHWC."""
    scaling, shift = vae_numbers(family)
    decoder = session(family, "vae_decoder")
    name = decoder.get_inputs()[0].name
    unscaled = (latents / np.float32(scaling) + np.float32(shift)).astype(np.float32)

    def one(part: np.ndarray) -> np.ndarray:
        return np.asarray(decoder.run(["sample"], {name: part})[0], dtype=np.float32)

    out = one(unscaled) if tile is None else tiled_decode(unscaled, one, tile // FACTOR, tile // 4 // FACTOR)
    return np.clip(out / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_decodes_the_same_latents_in_tiles(pipes: Any, family: str) -> None:
    """txt2img with ``vae_tiling``: the denoised latents (the callback's, unpacked for Flux and
    Chroma) decoded tile by tile; without it, whole. The tiles really differ from the whole."""
    pipe = pipes[family]
    kept: list[np.ndarray] = []
    tiled = pipe.generate(
        "a photo", **COMMON, vae_tiling=True, vae_tile_size=TILE, callback=lambda i, n, x: kept.append(x)
    )
    assert kept[-1].shape == (1, 16, 16, 24)
    np.testing.assert_allclose(tiled, ort_decode(family, kept[-1], TILE), atol=1e-5)
    whole = pipe.generate("a photo", **COMMON)
    np.testing.assert_allclose(whole, ort_decode(family, kept[-1], None), atol=1e-5)
    gap = float(np.abs(tiled - whole).max())
    assert 0.0 < gap < 0.5, gap  # less context per tile: close, not equal


@pytest.mark.parametrize("family", FAMILIES)
def test_img2img_encodes_in_tiles(pipes: Any, family: str) -> None:
    """The encoder's posterior parameters blended from tiles, then sampled, shifted and scaled as
    diffusers' ``(z - shift) * scaling``; and an img2img request with tiling starts from them
    (its first transformer input is those latents noised: checked through the pipeline's stage)."""
    pipe = pipes[family]
    scaling, shift = vae_numbers(family)
    image = np.linspace(-1, 1, 3 * 32 * 48, dtype=np.float32).reshape(1, 3, 32, 48)
    encoder = session(family, "vae_encoder")
    name = encoder.get_inputs()[0].name

    def one(part: np.ndarray) -> np.ndarray:
        return np.asarray(encoder.run(None, {name: part})[0], dtype=np.float32)

    params = tiled_encode(image, one, TILE, TILE // 4, factor=FACTOR)
    mean, logvar = params[:, :16], np.clip(params[:, 16:], -30.0, 20.0)
    draw = NoiseStream([5]).normal(mean.shape)
    expected = ((mean + np.exp(0.5 * logvar) * draw) - np.float32(shift)) * np.float32(scaling)
    got = vae.encode(pipe.components["vae_encoder"], image, NoiseStream([5]), 1, pipe.config, TILE)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    whole = vae.encode(pipe.components["vae_encoder"], image, NoiseStream([5]), 1, pipe.config)
    assert float(np.abs(whole - got).max()) > 1e-4  # tiling changed what it encodes

    from PIL import Image

    pixels = ((image[0].transpose(1, 2, 0) + 1) * 127.5).round().astype(np.uint8)
    request = pipe.request_class.create(
        "a photo", **COMMON, init_image=Image.fromarray(pixels), strength=0.5, vae_tiling=True, vae_tile_size=TILE
    )
    plan = pipe.plan(pipe.accept(request))
    start = pipe.initial_latents(plan, NoiseStream(plan.seeds))
    stream = NoiseStream(plan.seeds)
    encoded = vae.encode(pipe.components["vae_encoder"], plan.image, stream, 1, pipe.config, TILE)
    noise = stream.normal(encoded.shape)
    sigma = float(np.asarray(plan.scheduler.sigmas).reshape(-1)[0])
    want = (sigma * noise + (1.0 - sigma) * encoded).astype(np.float32)  # diffusers' scale_noise
    want = pack(want) if family != "sd3" else want
    np.testing.assert_allclose(start, want, atol=1e-5)


def test_cli_vae_tiling_on_flux(tmp_path: Path) -> None:
    """``sdkit generate --vae-tiling`` on a Flux folder writes the tiled image (8-bit)."""
    from PIL import Image

    from sdkit.cli.main import main

    out = tmp_path / "tiled.png"
    argv = ["generate", "a photo", "-m", str(FLOW / "flux_dev"), "-o", str(out), "--steps", "2", "--seed", "5"]
    argv += ["--width", "48", "--height", "32", "--backend", "reference", "--max-sequence-length", "32"]
    argv += ["--cfg", "7.5"]  # the API's default, which the expected image below is made with
    assert main([*argv, "--vae-tiling", "--vae-tile-size", str(TILE)]) == 0
    with Image.open(out) as image:
        written = np.asarray(image, dtype=np.float32) / 255
    kept: list[np.ndarray] = []
    pipe = sdkit.load_pipeline(FLOW / "flux_dev", backend="reference")
    pipe.generate("a photo", **{**COMMON, "guidance_scale": 7.5}, callback=lambda i, n, x: kept.append(x))
    assert np.abs(written - ort_decode("flux_dev", kept[-1], TILE)[0]).max() <= 1 / 255 + 1e-6
