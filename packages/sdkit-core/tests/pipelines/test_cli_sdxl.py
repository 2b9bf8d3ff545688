"""``sdkit generate`` with SDXL: second prompts, micro-conditioning flags and ``--refiner`` give
diffusers' image (the ``sdxl_base_refiner`` golden, through the PNG's 8 bits); bad combinations
are one line, before any model loads."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sdkit.cli.main import main
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


def test_base_and_refiner_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "xl.png"
    argv = ["generate", "a photo of an astronaut riding a horse on the moon", "--model", str(ROOT / "sdxl")]
    argv += ["--negative", "blurry, low quality", "--steps", "6", "--seed", "35", "--cfg", "5", "--sampler", "euler"]
    argv += ["--width", "48", "--height", "32", "--backend", "reference", "--threads", "1", "-o", str(out)]
    argv += ["--refiner", str(ROOT / "sdxl_refiner"), "--refiner-switch", "0.5", "--aesthetic-score", "6"]
    assert main(argv) == 0
    with Image.open(out) as png:
        pixels = np.asarray(png, dtype=np.float32) / 255
        text = png.info["parameters"]
    assert np.abs(pixels - GOLDENS.array("sdxl_base_refiner/image")[0]).max() <= 0.5 / 255 + 1e-3  # rounding to 8 bits
    assert text.endswith("Model: sdxl, Refiner: sdxl_refiner, Refiner switch at: 0.5, Software: sdkit")


def test_sdxl_flags_reach_the_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[Any] = []
    monkeypatch.setattr("sdkit.load_pipeline", lambda *a, **k: seen.append(a) or pytest.fail("no model may load"))
    from sdkit.cli.generate import build_request
    from sdkit.cli.main import build_parser

    argv = ["generate", "a", "--model", str(ROOT / "sdxl"), "--prompt-2", "b", "--negative-2", "c"]
    argv += ["--original-size", "96x64", "--target-size", "48x32", "--crop-top", "4", "--crop-left", "8"]
    argv += ["--prompt-weighting", "a1111", "--refiner-switch-at", "0.7"]
    args = build_parser().parse_args(argv)
    request = build_request(args)
    assert (request.prompt_2, request.negative_prompt_2, request.prompt_weighting) == ("b", "c", "a1111")
    assert (request.original_size, request.target_size) == ((64, 96), (32, 48))  # (height, width)
    assert request.crops_coords_top_left == (4, 8) and request.refiner_switch_at == 0.7
    assert not seen


@pytest.mark.parametrize(
    ("model", "extra", "match"),
    [
        ("sd15", ["--prompt-2", "x"], "--prompt-2 needs an SDXL model; sd15 is a StableDiffusionPipeline"),
        ("sd15", ["--refiner", str(ROOT / "sdxl_refiner")], "--refiner needs an SDXL model; sd15 is a"),
        ("sdxl", ["--refiner", str(ROOT / "sd15")], "--refiner must be an SDXL model; sd15 is StableDiffusionPipeline"),
        ("sdxl", ["--refiner", "nowhere"], "--refiner: nowhere not found"),
        ("sdxl", ["--original-size", "1024"], "--original-size expects WIDTHxHEIGHT"),
        ("sdxl", ["--refiner-switch", "1.5"], "refiner_switch_at must be between 0 and 1"),
        ("sdxl", ["--prompt-weighting", "compel"], "invalid choice"),
    ],
)
def test_bad_combinations_fail_before_loading(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: str, extra: list[str], match: str
) -> None:
    monkeypatch.setattr("sdkit.load_pipeline", lambda *a, **k: pytest.fail("no model may load"))
    code = 2 if "invalid choice" in match else 1  # argparse's own errors exit 2
    with pytest.raises(SystemExit) if code == 2 else contextlib.nullcontext():
        assert main(["generate", "a cat", "--model", str(ROOT / model), *extra]) == code
    err = capsys.readouterr().err.strip()
    assert match in err
    if code == 1:
        assert err.startswith("sdkit: error: ") and "\n" not in err
