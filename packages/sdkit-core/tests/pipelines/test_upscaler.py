"""Model upscalers on sdkit's backends against spandrel (``fixtures/upscalers/make_goldens.py``):
random-weight files of each architecture and key layout, written here from the seeded values
the fixture script fed spandrel (their hash is checked), upscaled by ``ModelUpscaler`` and
compared with spandrel's descriptor output (pad, clamp and crop included): max |diff| <= 1e-3
on [0, 1] images. Tiling is measured against the same oracle and against the untiled run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import InputError
from sdkit.pipelines.stages.upscaler import ModelUpscaler
from sdkit.testing.assets import load_module_file
from sdkit.testing.goldens import require_backend as available

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "upscalers"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]
TINY_CASES = sorted(k for k in GOLDENS if not k.startswith("full_"))
FULL_CASES = sorted(k for k in GOLDENS if k.startswith("full_"))
TOLERANCE = 1e-3


def _upscaler_weights() -> Any:
    """``fixtures/upscalers/upscaler_weights.py``: the seeded values the fixture script fed spandrel."""
    return load_module_file(FIXTURES / "upscaler_weights.py", "upscaler_weights")


WEIGHTS = _upscaler_weights()


def write_case(case: str, folder: Path) -> Path:
    facts = GOLDENS[case]
    values = WEIGHTS.random_values([(k, s) for k, s in facts["entries"]], facts["seed"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    path = folder / f"{case}.safetensors"
    save_file(values, str(path))
    return path


def golden(case: str) -> tuple[np.ndarray, np.ndarray]:
    """(input [1, H, W, 3], spandrel's output [1, sH, sW, 3])."""
    with np.load(FIXTURES / "goldens.npz") as data:
        return data[f"{case}.input"].transpose(0, 2, 3, 1), data[f"{case}.output"].transpose(0, 2, 3, 1)


def upscaler(path: Path, backend: str, **kwargs: Any) -> ModelUpscaler:
    options = {"threads": 1} if backend == "ggml" else {}
    return ModelUpscaler(path, backend=backend, graphs=[FIXTURES / "tiny"], **options, **kwargs)


@pytest.mark.parametrize("case", TINY_CASES)
def test_every_layout_matches_spandrel_on_the_reference_backend(case: str, tmp_path: Path) -> None:
    image, want = golden(case)
    got = upscaler(write_case(case, tmp_path), "reference", tile=0).upscale_array(image)
    diff = float(np.abs(got - want).max())
    print(f"{case}: {got.shape}, max |diff| vs spandrel {diff:.2e}")
    assert got.shape == want.shape and diff <= TOLERANCE


@pytest.mark.parametrize("backend", ["ggml", "openvino"])
@pytest.mark.parametrize("case", ["esrgan_x4_realesrgan", "esrgan_x2plus_realesrgan", "compact_x4"])
def test_each_architecture_matches_spandrel_on_compiling_backends(case: str, backend: str, tmp_path: Path) -> None:
    available(backend)
    image, want = golden(case)
    got = upscaler(write_case(case, tmp_path), backend, tile=0).upscale_array(image)
    diff = float(np.abs(got - want).max())
    print(f"{backend} {case}: max |diff| vs spandrel {diff:.2e}")
    assert got.shape == want.shape and diff <= TOLERANCE


@pytest.mark.parametrize("case", ["esrgan_x4_old", "esrgan_x2plus_realesrgan", "compact_x4"])
def test_tiles_blend_close_to_the_whole_image(case: str, tmp_path: Path) -> None:
    """Tiles of 8 input pixels overlapping by 4 on an 11x14 / 11x15 image (2 x 3 tiles, every
    one 8 x 8), the seams measured against spandrel's whole-image output. A CNN's output near a
    tile border sees less context, so tiled differs from whole there; the bound is what the
    linear ramps hold it to on these nets (measured: mean 7e-4..2.1e-3, max 0.008..0.021)."""
    image, want = golden(case)
    path = write_case(case, tmp_path)
    tiled = upscaler(path, "reference", tile=8, overlap=4).upscale_array(image)
    seam, mean = float(np.abs(tiled - want).max()), float(np.abs(tiled - want).mean())
    print(f"{case}: tiled 8/4 vs spandrel max {seam:.3f} mean {mean:.4f}")
    assert tiled.shape == want.shape
    assert mean < 0.005 and seam < 0.05
    if case == "compact_x4":  # a wider overlap (the receptive field's reach) comes closer
        wide = upscaler(path, "reference", tile=10, overlap=8).upscale_array(image)
        assert float(np.abs(wide - want).mean()) <= mean


def test_a1111_scale_semantics_and_bad_input(tmp_path: Path) -> None:
    """``upscale(image, scale)``: target ``int(size * scale) // 8 * 8``, the model run while
    smaller (a 2x model twice for 3x), Lanczos to the exact target; an 8-bit RGB image out."""
    from PIL import Image

    up = upscaler(write_case("compact_x2", tmp_path), "reference", tile=0)
    assert up.scale == 2
    image = Image.fromarray((golden("compact_x2")[0][0] * 255).astype(np.uint8))  # 9 x 12 (w x h)
    assert up.upscale(image).size == (16, 24)
    three = up.upscale(image, 3.0)
    assert three.size == (24, 32) and three.mode == "RGB"
    with pytest.raises(InputError):
        up.upscale(image, 0.0)
    ones = upscaler(write_case("esrgan_x1_old", tmp_path), "reference", tile=0)
    runs: list[int] = []
    original = ones.upscale_array
    ones.upscale_array = lambda x: runs.append(1) or original(x)  # type: ignore[method-assign]
    assert ones.upscale(image, 2.0).size == (16, 24) and len(runs) == 1  # a 1x model runs once, then Lanczos
    with pytest.raises(InputError):
        up.upscale_array(np.zeros((1, 4, 4, 4), np.float32))
    from sdkit.errors import ResourceLimitError
    from sdkit.limits import set_memory_budget

    set_memory_budget("1M")  # the output's buffers are checked before any tile runs
    try:
        with pytest.raises(ResourceLimitError, match="upscaling a 4096x4096 image 2x"):
            up.upscale_array(np.zeros((1, 4096, 4096, 3), np.float32))
    finally:
        set_memory_budget(None)
    with pytest.raises(InputError, match="multiples of 2"):
        upscaler(write_case("esrgan_x2plus_realesrgan", tmp_path), "reference", tile=9, overlap=4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
@pytest.mark.parametrize("case", FULL_CASES)
def test_full_size_architectures_match_spandrel(
    case: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The shipped graphs at full size (RealESRGAN_x4plus, x4plus_anime_6B, x2plus, ESRGAN_4x,
    realesr-general-x4v3, animevideov3 configurations) with random weights, on a small image
    (37 s in all on the reference backend: run with ``-m slow``; measured max |diff| <= 2.3e-6 on all three)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("full-size upscalers (minutes on 2 cores): pytest -m slow")
    image, want = golden(case)
    available(backend)
    options = {"threads": 2} if backend == "ggml" else {}
    got = ModelUpscaler(write_case(case, tmp_path), backend=backend, tile=0, **options).upscale_array(image)
    diff = float(np.abs(got - want).max())
    print(f"{backend} {case}: max |diff| vs spandrel {diff:.2e}")
    assert diff <= TOLERANCE


def test_cli_and_api_upscale_a_png_with_a_shipped_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sdkit upscale`` and ``sdkit.upscale`` with an animevideov3-sized Compact file (a shipped
    graph) found by A1111's name in ``$SDKIT_UPSCALER_DIR``: the PNG is spandrel's output in 8
    bits (rounded: within one level)."""
    from PIL import Image

    from sdkit.cli.main import main

    folder = tmp_path / "upscalers"
    folder.mkdir()
    write_case("full_animevideov3", tmp_path).rename(folder / "realesr-animevideov3.safetensors")
    image, want = golden("full_animevideov3")
    source = tmp_path / "in.png"
    Image.fromarray(np.round(image[0] * 255).astype(np.uint8)).save(source)
    # spandrel's output for the 8-bit image is the golden's input quantised: compare in 8 bits
    # against the golden within the quantisation's reach on these weights
    monkeypatch.setenv("SDKIT_UPSCALER_DIR", str(folder))
    out = tmp_path / "out.png"
    argv = [
        "upscale",
        str(source),
        "--model",
        "R-ESRGAN AnimeVideo",
        "-o",
        str(out),
        "--backend",
        "reference",
    ]
    assert main(argv) == 0
    assert main(argv) == 1  # exists: refused without --force
    got = np.asarray(Image.open(out), dtype=np.float32) / 255.0
    assert got.shape == want.shape[1:]
    assert float(np.abs(got - want[0]).max()) <= 0.02
    api = sdkit.upscale(source, "R-ESRGAN AnimeVideo", backend="reference")
    assert np.array_equal(np.asarray(api), np.asarray(Image.open(out)))
    half = sdkit.upscale(Image.open(source), folder / "realesr-animevideov3.safetensors", 2, backend="reference")
    assert half.size == (16, 8)  # 8x6 * 2 -> 16x12 -> rounded down to 8s: 16x8
    with pytest.raises(InputError, match=r"unknown upscaler 'R-ESRGAN 4x\+'.*R-ESRGAN AnimeVideo"):
        sdkit.upscale(source, "R-ESRGAN 4x+")
