"""ParseNet face parsing against facexlib (``fixtures/faces/detect/export_parsenet_graphs.py``):
random-weight files of the released configuration (21M weights; written here from the seeded
values the fixture script loaded into facexlib's module, their hash checked) run by
``ParseNetParser`` on reference, ggml and openvino.

- logits at 32x32 vs facexlib's: max |diff| <= 1e-3 of the largest logit;
- class maps (argmax) at 32x32 and 48x32 (the smallest sizes: 2x2 at the bottom), and through
  ``parse`` at 512x512 (``-m slow``): equal to facexlib's at every pixel where facexlib's top-1
  minus top-2 logit margin exceeds 1e-3 of the largest logit (99.1-100% of the pixels with random
  weights: ``clear_fraction`` in the goldens); below that margin, differences at the raw-output
  tolerance may swap the two classes, so those pixels are not compared (the test prints how many
  differ there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.families.parsenet import ParseNetConfig, expected_shapes, sniff
from sdkit.pipelines.stages.parsenet import ParseNetParser
from sdkit.testing.assets import load_module_file

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "detect"
RECORD: dict[str, Any] = json.loads((FIXTURES / "parsenet_goldens.json").read_text())
GOLDENS: dict[str, Any] = RECORD["cases"]
TOLERANCE = 1e-3


def _face_weights() -> Any:
    return load_module_file(FIXTURES / "face_weights.py", "face_weights")


WEIGHTS = _face_weights()


def golden(case: str) -> dict[str, np.ndarray]:
    facts = GOLDENS[case]
    with np.load(FIXTURES / "parsenet_goldens.npz") as data:
        out = {k.partition(".")[2]: data[k] for k in data.files if k.startswith(f"{case}.")}
    h, w = facts["input"]
    face = WEIGHTS.face_image((h, w), facts["face_seed"])
    assert WEIGHTS.values_hash({"face": face}) == facts["face_sha256"]
    out["face"] = face.astype(np.float32) / np.float32(255.0)
    out["clear"] = np.unpackbits(out["clear"])[: h * w].reshape(h, w).astype(bool)
    return out


def write_case(case: str, folder: Path) -> Path:
    facts = GOLDENS[case]
    values = WEIGHTS.random_values([(k, s) for k, s in facts["entries"]], facts["seed"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    path = folder / f"{case}.safetensors"
    save_file(values, str(path))
    return path


def parser(path: Path, backend: str) -> ParseNetParser:
    found = next((b for b in sdkit.backends() if b.name == backend), None)
    if found is None or not found.available:
        pytest.skip(f"backend {backend} unavailable")
    return ParseNetParser(path, backend=backend, **({"threads": 1} if backend == "ggml" else {}))


def check_classes(case: str, got: np.ndarray, want: dict[str, np.ndarray]) -> None:
    clear = want["clear"]
    wrong = int(((got != want["classes"]) & clear).sum())
    unclear = int((got != want["classes"]).sum()) - wrong
    print(f"{case}: {clear.mean():.2%} of pixels clear, {wrong} differ there, {unclear} differ elsewhere")
    assert got.shape == want["classes"].shape and wrong == 0


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    path = write_case("parse_32x32", tmp_path_factory.mktemp("parsenet"))
    assert GOLDENS["parse_48x32"]["values_sha256"] == GOLDENS["parse_32x32"]["values_sha256"]
    return {"parse_32x32": path, "parse_48x32": path}


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_logits_and_class_maps_match_facexlib(backend: str, files: dict[str, Path]) -> None:
    want = golden("parse_32x32")
    parsenet = parser(files["parse_32x32"], backend)
    logits = parsenet.logits(want["face"])
    scale = float(np.abs(want["logits"]).max())
    diff = float(np.abs(logits - want["logits"]).max())
    print(f"{backend}: logits max |diff| {diff:.2e} of scale {scale:.3g} ({diff / scale:.2e})")
    assert logits.shape == want["logits"].shape and diff <= TOLERANCE * scale
    check_classes("parse_32x32", logits.argmax(axis=0), want)
    other = golden("parse_48x32")
    check_classes("parse_48x32", parsenet.logits(other["face"]).argmax(axis=0), other)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_parse_at_512_matches_facexlib(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("ParseNet at 512x512 (about 40 GMAC): pytest -m slow")
    want = golden("parse_512x512")
    got = parser(write_case("parse_512x512", tmp_path), backend).parse(want["face"])
    assert got.dtype == np.int64
    check_classes(f"parse_512x512 {backend}", got, want)


def test_config_is_read_from_shapes() -> None:
    released = expected_shapes(ParseNetConfig())
    assert sniff(released) == ParseNetConfig()
    assert sniff({"module." + k: v for k, v in released.items()}) == ParseNetConfig()
    assert sniff({**released, "body.0.conv1.norm.norm.num_batches_tracked": ()}) == ParseNetConfig()
    manifest = json.loads((FIXTURES.parents[1] / "families" / "manifest.json").read_text())
    assert {k: tuple(v) for k, v in manifest[ParseNetConfig().graph_name].items()} == released
    small = ParseNetConfig(base=32, max_ch=64, down=2, up=2, depth=1, classes=5)
    assert sniff(expected_shapes(small)) == small
    broken = dict(released)
    broken.pop("body.3.conv2.norm.norm.running_var")
    assert sniff(broken) is None
    assert sniff({"model.0.weight": (64, 3, 3, 3)}) is None and sniff({}) is None


def test_bad_input_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    p = parser(files["parse_32x32"], "reference")
    for bad in (np.zeros((64, 64), np.float32), np.zeros((40, 32, 3), np.float32), np.zeros((16, 16, 3), np.float32)):
        with pytest.raises(InputError):
            p.logits(bad)
    with pytest.raises(InputError):
        p.parse(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(InputError):
        p.logits(np.full((32, 32, 3), np.nan, np.float32))
    with pytest.raises(InputError, match="floats"):
        p.logits(np.zeros((32, 32, 3), np.uint8))  # 0..255 bytes would be read as far out of [0, 1]
    pth = tmp_path / "parsing_parsenet.pth"
    pth.write_bytes(b"\x80\x04 not read")
    with pytest.raises(ModelFormatError, match="weights_only=True"):
        ParseNetParser(pth)
