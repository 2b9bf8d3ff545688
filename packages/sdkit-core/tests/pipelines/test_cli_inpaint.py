"""``sdkit generate --mask ... --control ...``: a PNG from the command line, the ``--control``
syntax, and every bad combination refused in one line before any model compiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sdkit.cli.inpaint_options import parse_control
from sdkit.cli.main import main
from sdkit.errors import InputError
from sdkit.pipelines.stages.components import Component
from sdkit.testing.cli_output import without_progress
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
NET = ROOT / "controlnet" / "sd15_a"
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("inputs")
    names = {"init": "init_image", "mask": "mask_image", "edges": "control_edges"}
    arrays = {name: GOLDENS.array(key) for name, key in names.items()}
    arrays["black"] = np.zeros_like(arrays["mask"])
    for name, array in arrays.items():
        Image.fromarray(array).save(folder / f"{name}.png")
    return {name: str(folder / f"{name}.png") for name in arrays}


def test_inpainting_with_a_controlnet_writes_a_png(files: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    argv = ["generate", "a cat", "-m", str(ROOT / "sd15"), "-o", str(out), "--steps", "2", "--seed", "4"]
    argv += ["--init-image", files["init"], "--mask", files["mask"], "--mask-blur", "2", "--inpaint-full-res"]
    argv += ["--control", f"{files['edges']}:{NET}:0.8:0:0.5", "--backend", "reference", "--width", "32"]
    assert main(argv) == 0
    with Image.open(out) as image:
        assert image.size == (48, 32)  # "only masked": generated at 32 x 32, pasted into the 48 x 32 image
        assert "Size: 32x32" in image.info["parameters"]


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        ("e.png:models/canny", {"image": "e.png", "model": "canny", "preprocessor": None}),
        ("e.png:models/canny:0.8", {"image": "e.png", "model": "canny", "scale": 0.8, "preprocessor": None}),
        ("e.png:m/c/model.onnx:1:0.1:0.9:canny",
         {"image": "e.png", "model": "c", "scale": 1.0, "start": 0.1, "end": 0.9, "preprocessor": "canny"}),
        ("e.png:c:canny", {"image": "e.png", "model": "c", "preprocessor": "canny"}),
    ],
)  # fmt: skip
def test_control_syntax(text: str, unit: dict[str, Any]) -> None:
    assert parse_control(text)[0] == unit


@pytest.mark.parametrize("text", ["e.png", "e.png:", ":c", "e.png:c:canny:0.5", "e.png:c:1:0:1:0.5"])
def test_bad_control_syntax(text: str) -> None:
    with pytest.raises(InputError, match="--control"):
        parse_control(text)


@pytest.fixture
def nothing_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Component, model: Any) -> Any:
        raise AssertionError(f"{self.name} compiled before the request was checked")

    monkeypatch.setattr(Component, "_compile", refuse)


@pytest.mark.usefixtures("nothing_compiles")
@pytest.mark.parametrize(
    ("folder", "extra", "message"),
    [
        ("sd15", ["--mask", "{mask}"], "a mask needs an init_image"),
        ("sd15", ["--mask-blur", "4"], "mask_blur is an inpainting option"),
        ("sd15", ["--init-image", "{init}", "--mask", "{black}"], "selects nothing to repaint"),
        ("sd15_inpaint", [], "is an inpainting model"),
        ("sd15_inpaint", ["--init-image", "{init}"], "is an inpainting model"),
        ("sd15", ["--control", "{edges}:{cn}:0.5:cany"], "unknown ControlNet preprocessor"),
        ("sd15", ["--control", "{edges}:{cn}:1:0.7:0.2"], "start < end"),
        ("sd15", ["--control", "{edges}:/no/such/controlnet"], "ControlNet not found"),
        ("sd15", ["--control", "{edges}:{xl}"], "an SDXL ControlNet"),
        (
            "sd15_inpaint",
            ["--init-image", "{init}", "--mask", "{mask}", "--control", "{edges}:{cn}"],
            "unet_controlnet",
        ),
        ("sd15", ["--init-image", "{init}", "--mask", "{mask}", "--width", "36"], "multiple of 8"),
    ],
)
def test_bad_combinations_fail_in_one_line_before_compiling(
    folder: str,
    extra: list[str],
    message: str,
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = {**files, "cn": str(NET), "xl": str(ROOT / "controlnet" / "sdxl_a")}
    args = [a.format(**names) for a in extra]
    argv = ["generate", "x", "-m", str(ROOT / folder), "-o", str(tmp_path / "x.png"), "--backend", "reference", *args]
    assert main(argv) == 1
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("sdkit: error: ")
    assert "\n" not in err
    assert message in err
