"""GFPGAN on sdkit's backends against spandrel (``fixtures/faces/gfpgan/make_goldens.py``):
random-weight files of GFPGANv1Clean (a tiny configuration with its own graph; v1.4 at full size
with ``-m slow``), written here from the seeded values the fixture script fed spandrel (their hash
is checked), restored by ``GFPGANRestorer`` and compared with spandrel's module run as gfpgan and
A1111 run it (normalised to [-1, 1], clamped, back to [0, 1]): max |diff| <= 1e-3 on [0, 1]
images. Both noise modes: ``stored`` (the file's noise buffers, spandrel's ``randomize_noise=False``)
and ``random`` (numpy's seeded N(0, 1) draws, put into spandrel's buffers by the fixture).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from sdkit.errors import InputError
from sdkit.pipelines.stages.gfpgan import GFPGANRestorer
from sdkit.testing.assets import load_module_file
from sdkit.testing.goldens import require_backend as available

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "gfpgan"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]
TOLERANCE = 1e-3


def _weights_module() -> Any:
    """``fixtures/faces/gfpgan/gfpgan_weights.py``: the seeded values the fixture fed spandrel."""
    return load_module_file(FIXTURES / "gfpgan_weights.py", "gfpgan_weights")


WEIGHTS = _weights_module()


def write_case(case: str, folder: Path, prefix: str = "") -> Path:
    facts = GOLDENS[case]
    values = WEIGHTS.random_values([(k, s) for k, s in facts["entries"]], facts["seed"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    path = folder / f"{case}.safetensors"
    save_file({prefix + k: v for k, v in values.items()}, str(path))
    return path


def golden(case: str) -> tuple[np.ndarray, np.ndarray]:
    """(face (S, S, 3), spandrel's restored face (S, S, 3); the full-size one strided)."""
    facts = GOLDENS[case]
    with np.load(FIXTURES / "goldens.npz") as data:
        want = data[f"{case}.output"]
        if f"{case}.input" in data:
            return data[f"{case}.input"], want
    face, _ = WEIGHTS.random_inputs(facts["config"]["out_size"], facts["seed"])
    return face[0].transpose(1, 2, 0), want


def restorer(path: Path, backend: str, noise: str) -> GFPGANRestorer:
    options = {"threads": 1} if backend == "ggml" else {}
    return GFPGANRestorer(path, backend=backend, noise=noise, graphs=[FIXTURES / "tiny"], **options)


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
@pytest.mark.parametrize("case", ["tiny_stored", "tiny_random"])
def test_tiny_gfpgan_matches_spandrel(case: str, backend: str, tmp_path: Path) -> None:
    available(backend)
    face, want = golden(case)
    prefix = "params_ema." if case == "tiny_random" else ""  # a converted release keeps it
    up = restorer(write_case(case, tmp_path, prefix), backend, GOLDENS[case]["noise"])
    assert (up.name, up.size, up.takes_fidelity) == ("GFPGAN", 64, False)
    got = up.restore(face)
    diff = float(np.abs(got - want).max())
    print(f"{backend} {case}: max |diff| vs spandrel {diff:.2e}")
    assert got.shape == want.shape == (64, 64, 3) and got.dtype == np.float32
    assert diff <= TOLERANCE
    assert np.array_equal(up.restore(face), got)  # seeded noise: the same face, the same result


def test_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    face, _ = golden("tiny_random")
    path = write_case("tiny_random", tmp_path)
    up = restorer(path, "reference", "random")
    with pytest.raises(InputError, match="no fidelity weight"):
        up.restore(face, fidelity=0.5)
    with pytest.raises(InputError, match=r"\(64, 64, 3\) RGB face crop"):
        up.restore(face[:32])
    with pytest.raises(InputError, match="NaN"):
        up.restore(np.full_like(face, np.nan))
    with pytest.raises(InputError, match="noise must be one of"):
        GFPGANRestorer(path, backend="reference", noise="none", graphs=[FIXTURES / "tiny"])
    other = GFPGANRestorer(path, backend="reference", seed=5, graphs=[FIXTURES / "tiny"])
    assert not np.array_equal(other.restore(face), up.restore(face))  # the noise does matter


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ggml", "openvino", "reference"])
def test_full_size_v14_matches_spandrel(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """GFPGAN v1.4's configuration at full size (84M parameters used, 512 px) with random weights,
    loaded by spandrel's own detection in the fixture; compared on every 4th pixel of each axis.
    Measured (2-vCPU EPYC shared, load ~15): max |diff| 6.9e-7 ggml (87 s), 1.3e-6 openvino (25 s),
    7.2e-7 reference (435 s: onnx.reference's convs at 512 px)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("full-size GFPGAN (a 350 MB file; minutes on 2 cores): pytest -m slow")
    available(backend)
    face, want = golden("full_v14_stored")
    options = {"threads": 2} if backend == "ggml" else {}
    up = GFPGANRestorer(write_case("full_v14_stored", tmp_path), backend=backend, noise="stored", **options)
    assert up.size == 512
    stride = GOLDENS["full_v14_stored"]["output_stride"]
    got = up.restore(face)[::stride, ::stride]
    diff = float(np.abs(got - want).max())
    print(f"{backend} full v1.4: max |diff| vs spandrel {diff:.2e}")
    assert got.shape == want.shape and diff <= TOLERANCE
