"""SwinIR upscalers on sdkit's backends against spandrel (``fixtures/upscalers/make_swinir_goldens.py``):
random-weight files of spandrel's SwinIR (tiny: embed 16, window 4, two RSTBs, the nearest+conv,
pixelshuffle and pixelshuffledirect upsamplers, 1conv and 3conv), written here from the seeded
values the fixture script fed spandrel (their hash is checked) and the buffers spandrel's module
built, upscaled by ``ModelUpscaler`` and compared with spandrel's descriptor output (its padding to
16 pixels and to the window, clamp and crop included): max |diff| <= 1e-3 on [0, 1] images.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.families.upscalers import relative_position_index
from sdkit.pipelines.stages.upscaler import (
    DEFAULT_OVERLAP,
    DEFAULT_TILE,
    ModelUpscaler,
    aligned_tiles,
    pad_like_spandrel,
)
from sdkit.testing.assets import load_module_file
from sdkit.testing.goldens import require_backend as available

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "upscalers"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "swinir_goldens.json").read_text())["cases"]
TINY = ["swinir_nc_x4", "swinir_ps_x2", "swinir_ps_x3", "swinir_psd_x2"]
FULL = sorted(k for k in GOLDENS if k.startswith("full_"))
TOLERANCE = 1e-3


def _module(name: str) -> Any:
    return load_module_file(FIXTURES / f"{name}.py", name)


WEIGHTS = _module("upscaler_weights")


def shift_mask(size: int, window: int) -> np.ndarray:
    """SwinIR's ``calculate_mask`` for a size x size image (the full cases' ``attn_mask`` buffers)."""
    shift = window // 2
    region = (np.arange(size) >= size - window).astype(int) + (np.arange(size) >= size - shift)
    ids = (region[:, None] * 3 + region[None, :]).reshape(size // window, window, size // window, window)
    ids = ids.transpose(0, 2, 1, 3).reshape(-1, window * window)
    return np.where(ids[:, None, :] != ids[:, :, None], np.float32(-100.0), np.float32(0.0))


def file_values(case: str) -> dict[str, np.ndarray]:
    """The case's tensors in file order: seeded parameters (hash checked) and its buffers."""
    facts = GOLDENS[case]
    buffers = set(facts["buffers"])
    params = [(k, s) for k, s in facts["entries"] if k not in buffers]
    values = WEIGHTS.swinir_values(params, facts["seed"], facts["conv_gain"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    spec = facts["spec"]
    with np.load(FIXTURES / "swinir_goldens.npz") as data:
        for key, shape in facts["entries"]:
            if key in buffers and f"{case}.buffer.{key}" in data:
                values[key] = data[f"{case}.buffer.{key}"]
            elif key.endswith("relative_position_index"):
                values[key] = relative_position_index(spec["window_size"])
            elif key in buffers:
                values[key] = shift_mask(spec["img_size"], spec["window_size"])
            assert list(values[key].shape) == shape, key
    return {k: values[k] for k, _ in facts["entries"]}


def write_case(case: str, folder: Path, name: str | None = None, **changes: np.ndarray) -> Path:
    values = {**file_values(case), **changes}
    path = folder / f"{name or case}.safetensors"
    save_file(values, str(path))
    return path


def golden(case: str) -> tuple[np.ndarray, np.ndarray]:
    """(input [1, H, W, 3], spandrel's output [1, sH, sW, 3])."""
    with np.load(FIXTURES / "swinir_goldens.npz") as data:
        return data[f"{case}.input"].transpose(0, 2, 3, 1), data[f"{case}.output"].transpose(0, 2, 3, 1)


def upscaler(path: Path, backend: str, **kwargs: Any) -> ModelUpscaler:
    options = {"threads": 1} if backend == "ggml" else {}
    return ModelUpscaler(path, backend=backend, graphs=[FIXTURES / "tiny"], **options, **kwargs)


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
@pytest.mark.parametrize("case", TINY)
def test_swinir_matches_spandrel(case: str, backend: str, tmp_path: Path) -> None:
    """Each upsampler on each backend, whole image (11x14, 9x13, 8x8, 10x7: padded to 16 and to
    the window as spandrel pads, the shifted windows' masks computed in the graph at that size).
    Measured max |diff|: <= 1.2e-6 on all three backends."""
    available(backend)
    image, want = golden(case)
    got = upscaler(write_case(case, tmp_path), backend, tile=0).upscale_array(image)
    diff = float(np.abs(got - want).max())
    print(f"{backend} {case}: {got.shape}, max |diff| vs spandrel {diff:.2e}")
    assert got.shape == want.shape and diff <= TOLERANCE


def test_the_attention_path_is_what_is_measured(tmp_path: Path) -> None:
    """Negative controls: spandrel's own output moves far past the tolerance without the shift
    masks and with a shifted block's bias table reversed (recorded by the fixture script: the
    cases' weights make the attention matter); sdkit's output with that table reversed moves as
    far; a file whose ``relative_position_index`` is not SwinIR's is refused, not run on the
    architecture's index."""
    for case in TINY:
        moves = GOLDENS[case]["spandrel_moves"]
        assert min(moves.values()) > 15 * TOLERANCE, (case, moves)  # measured 18x..82x
        assert GOLDENS[case]["fraction_in_0_1"] > 0.75  # mostly unclamped: the comparison sees values
    image, want = golden("swinir_nc_x4")
    key = "layers.1.residual_group.blocks.1.attn.relative_position_bias_table"
    table = file_values("swinir_nc_x4")[key]
    changed = write_case("swinir_nc_x4", tmp_path, "changed", **{key: table[::-1].copy()})  # positions swapped
    got = upscaler(changed, "openvino", tile=0).upscale_array(image)
    assert float(np.abs(got - want).max()) > 20 * TOLERANCE
    index_key = "layers.0.residual_group.blocks.0.attn.relative_position_index"
    index = file_values("swinir_nc_x4")[index_key][::-1].copy()
    with pytest.raises(ModelFormatError, match="not SwinIR's relative position index"):
        upscaler(write_case("swinir_nc_x4", tmp_path, "bad_index", **{index_key: index}), "reference")


def test_tiles_blend_close_to_the_whole_image(tmp_path: Path) -> None:
    """A 36x44 image (spandrel's whole-image output as the oracle) in tiles that are multiples of
    the window (4). Every block mixes a window and the shifted ones the next, through 4 blocks:
    the context a tile cuts off reaches further than a small CNN's, and these weights make the
    attention matter (see above), so seams are larger than ESRGAN's and shrink with the tile.
    Measured (openvino; ggml the same to 1e-6): 16/8 max 0.082 mean 0.0085, 24/8 max 0.055 mean
    0.0031, 32/16 max 0.027 mean 0.0014. spandrel itself marks SwinIR's tiling "discouraged";
    the default tile (192) runs this image whole: within 1e-3."""
    available("openvino")
    image, want = golden("swinir_nc_x4_big")
    path = write_case("swinir_nc_x4_big", tmp_path)
    whole = upscaler(path, "openvino").upscale_array(image)
    assert float(np.abs(whole - want).max()) <= TOLERANCE
    errors = {}
    for tile, overlap in ((16, 8), (32, 16)):
        tiled = upscaler(path, "openvino", tile=tile, overlap=overlap).upscale_array(image)
        assert tiled.shape == want.shape
        errors[tile] = (float(np.abs(tiled - want).max()), float(np.abs(tiled - want).mean()))
        print(f"tiled {tile}/{overlap} vs spandrel max {errors[tile][0]:.4f} mean {errors[tile][1]:.5f}")
    assert errors[16][0] < 0.12 and errors[16][1] < 0.012
    assert errors[32][0] < 0.04 and errors[32][1] < 0.002 and errors[32][1] < errors[16][1] / 3
    with pytest.raises(InputError, match="multiples of 4"):
        upscaler(path, "reference", tile=18, overlap=8)


def test_default_tiles_follow_the_window_explicit_ones_are_checked() -> None:
    """192/16 suit window 8 (and ESRGAN) as they are; for SwinIR's window 7 (the JPEG models)
    the defaults become 189/21; a tile or overlap given explicitly is never changed silently."""
    assert aligned_tiles(DEFAULT_TILE, DEFAULT_OVERLAP, 8) == (192, 16)
    assert aligned_tiles(DEFAULT_TILE, DEFAULT_OVERLAP, 7) == (189, 21)
    assert aligned_tiles(0, DEFAULT_OVERLAP, 7) == (0, 16)  # no tiles: the overlap is unused
    assert aligned_tiles(56, 14, 7) == (56, 14)
    with pytest.raises(InputError, match="multiples of 7"):
        aligned_tiles(192, 14, 7)


def test_padding_is_spandrels() -> None:
    """Up to 16 px (reflect, then edge past ``size - 1``), then to the window (reflect), at the
    bottom and right: spandrel's ``pad_tensor`` + ``pad_to_multiple``, written out by hand."""
    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(1, 2, 5, 3)
    padded = pad_like_spandrel(x, 16, 8)
    assert padded.shape == (1, 2, 16, 16)
    rows = [0, 1, 2, 3, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # reflect 4, then edge (the reflected edge)
    cols = [0, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(padded[0, 1], x[0, 1][np.ix_(rows, cols)])
    assert pad_like_spandrel(x, 0, 4).shape == (1, 2, 8, 4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
@pytest.mark.parametrize("case", FULL)
def test_full_size_swinir_matches_spandrel(
    case: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The shipped SwinIR-L real-world x4 (A1111's "SwinIR 4x") and SwinIR-M classical x4 graphs
    with random weights on a 16x16 image (``-m slow``)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("full-size SwinIR (minutes on 2 cores): pytest -m slow")
    available(backend)
    image, want = golden(case)
    options = {"threads": 2} if backend == "ggml" else {}
    got = ModelUpscaler(write_case(case, tmp_path), backend=backend, tile=0, **options).upscale_array(image)
    diff = float(np.abs(got - want).max())
    print(f"{backend} {case}: max |diff| vs spandrel {diff:.2e}")
    assert diff <= TOLERANCE


@pytest.fixture
def tiny_graphs_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny SwinIR graphs found where the shipped ones are (the wiring tests below run tiny
    files through paths that take no graph folder: the CLI by name, the hires fix)."""
    from sdkit.families import upscalers

    monkeypatch.setattr(upscalers, "graphs_dir", lambda: FIXTURES / "tiny")


@pytest.mark.usefixtures("tiny_graphs_shipped")
def test_cli_and_api_upscale_with_swinir_by_a1111_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sdkit upscale --model "SwinIR 4x"`` (A1111's name: the file it saves as
    ``SwinIR_4x``, here a tiny 2x SwinIR) and ``sdkit.upscale``: the same image as the upscaler
    itself (held to spandrel above), A1111's target size (13x9 * 2 -> 24x16)."""
    from PIL import Image

    from sdkit.cli.main import main

    folder = tmp_path / "upscalers"
    folder.mkdir()
    path = write_case("swinir_ps_x2", folder, "SwinIR_4x")
    image, _ = golden("swinir_ps_x2")
    source = tmp_path / "in.png"
    Image.fromarray(np.round(image[0] * 255).astype(np.uint8)).save(source)
    monkeypatch.setenv("SDKIT_UPSCALER_DIR", str(folder))
    out = tmp_path / "out.png"
    assert main(["upscale", str(source), "--model", "SwinIR 4x", "-o", str(out), "--backend", "openvino"]) == 0
    want = ModelUpscaler(path, backend="openvino").upscale(Image.open(source))
    got = Image.open(out)
    assert got.size == want.size == (24, 16)
    assert np.array_equal(np.asarray(got), np.asarray(want))
    api = sdkit.upscale(source, "swinir 4x", backend="openvino")
    assert np.array_equal(np.asarray(api), np.asarray(want))


@pytest.mark.usefixtures("tiny_graphs_shipped")
def test_hires_fix_with_swinir_by_a1111_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hr_upscaler="SwinIR 4x"``: the second pass's encoder receives the first pass's image
    upscaled by that file (a tiny 2x SwinIR: one pass to 64x64); the PNG keeps A1111's name
    (3 s on an idle 2-core machine, most of it loading the tiny SD 1.5 pipeline)."""
    hires = _hires_module()
    folder = tmp_path / "ups"
    folder.mkdir()
    path = write_case("swinir_ps_x2", folder, "SwinIR_4x")
    monkeypatch.setenv("SDKIT_UPSCALER_DIR", str(folder))
    pipe = sdkit.load_pipeline(hires.SD15, backend="reference")
    try:
        first = hires.run(pipe, output_type="pil")[0][0]
        with hires.encoder_inputs(pipe) as calls:
            out, _ = hires.run(pipe, enable_hr=True, hr_upscaler="SwinIR 4x", hr_scale=2, output_type="pil")
    finally:
        pipe.close()
    want = ModelUpscaler(path, backend="reference").upscale(first, 2.0)
    assert want.size == (64, 64)
    expected = np.asarray(want, dtype=np.float32) / 255 * 2 - 1
    np.testing.assert_allclose(calls[0][0].transpose(1, 2, 0), expected, atol=1e-6)
    assert "Hires upscaler: SwinIR 4x" in out[0].info["parameters"]


def _hires_module() -> Any:
    """``test_hires_fix.py`` (beside this file): its tiny SD 1.5 pipeline's request and encoder spy."""
    spec = importlib.util.spec_from_file_location("hires_cases", Path(__file__).with_name("test_hires_fix.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not (module.SD15 / "model_index.json").is_file():
        pytest.skip("fixtures/tiny_xl missing")
    return module
