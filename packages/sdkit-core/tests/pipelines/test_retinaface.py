"""RetinaFace face detection against facexlib (``fixtures/faces/detect/make_goldens.py``).

Random weights give meaningless detections, so the oracle has two layers:

1. the network: random-weight files (written here from the seeded values the fixture script
   loaded into facexlib's module; their hash is checked) run by ``RetinaFaceDetector`` on
   reference, ggml and openvino; its raw outputs (loc, conf, landmarks) vs those facexlib's
   ``detect_faces`` computed on the same RGB image: max |diff| <= 1e-3 of the output's largest
   magnitude, for MobileNet0.25 and ResNet50 (facexlib's two released detectors).
2. the numpy post-processing (prior boxes, decoding, threshold, order, NMS) vs facexlib's on the
   SAME crafted raw outputs (hundreds of overlapping boxes above the threshold): the same faces
   kept in the same order, scores equal, boxes and landmarks equal to float32 rounding
   (rtol 1e-6: numpy's and torch's float32 ``exp`` may differ in the last bit).

And end to end: ``detect`` at loose thresholds (random weights score near 0.5) gives facexlib's
``detect_faces`` result on the reference backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from sdkit.errors import InputError
from sdkit.pipelines.stages.retinaface import (
    DetectedFace,
    RetinaFaceDetector,
    detections,
    prior_boxes,
)
from sdkit.testing.assets import load_module_file
from sdkit.testing.goldens import require_backend as available

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "detect"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]
POST_CASES = sorted(k for k in GOLDENS if k.startswith("post_"))
TOLERANCE = 1e-3  # of the output's largest magnitude
OUTPUTS = ("loc", "conf", "landmarks")


def _face_weights() -> Any:
    return load_module_file(FIXTURES / "face_weights.py", "face_weights")


WEIGHTS = _face_weights()


def golden(case: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "goldens.npz") as data:
        return {k.partition(".")[2]: data[k] for k in data.files if k.startswith(f"{case}.")}


def write_case(case: str, folder: Path, prefix: str = "module.") -> Path:
    """The case's random weights as a safetensors file under the released files' ``module.``
    prefix, ``num_batches_tracked`` included (as a converted ``.pth`` has them)."""
    facts = GOLDENS[case]
    values = WEIGHTS.random_values([(k, s) for k, s in facts["entries"]], facts["seed"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    path = folder / f"{case}.safetensors"
    save_file({prefix + k: v for k, v in values.items()}, str(path))
    return path


def detector(path: Path, backend: str) -> RetinaFaceDetector:
    options = {"threads": 1} if backend == "ggml" else {}
    return RetinaFaceDetector(path, backend=backend, **options)


def check_raw_outputs(case: str, det: RetinaFaceDetector) -> None:
    want = golden(case)
    got = dict(zip(OUTPUTS, det.raw_outputs(want["image"]), strict=True))
    for name in OUTPUTS:
        scale = float(np.abs(want[name]).max())
        diff = float(np.abs(got[name] - want[name]).max())
        print(f"{case} {det.backend} {name}: max |diff| {diff:.2e} of scale {scale:.3g} ({diff / scale:.2e})")
        assert got[name].shape == want[name].shape and diff <= TOLERANCE * scale


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_mobilenet_outputs_match_facexlib(backend: str, tmp_path: Path) -> None:
    """One detector, two image sizes (the graph's dynamic height and width), then the first again."""
    available(backend)
    assert GOLDENS["net_mobilenet025_64x40"]["values_sha256"] == GOLDENS["net_mobilenet025_33x47"]["values_sha256"]
    det = detector(write_case("net_mobilenet025_33x47", tmp_path), backend)
    for case in ("net_mobilenet025_33x47", "net_mobilenet025_64x40", "net_mobilenet025_33x47"):
        check_raw_outputs(case, det)


@pytest.fixture(scope="module")
def resnet50_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_case("net_resnet50_33x47", tmp_path_factory.mktemp("resnet50"))


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_resnet50_outputs_match_facexlib(backend: str, resnet50_file: Path) -> None:
    """The full ResNet50 detector A1111 uses (27M random weights, one 110 MB file for the three)."""
    available(backend)
    check_raw_outputs("net_resnet50_33x47", detector(resnet50_file, backend))


@pytest.mark.parametrize("case", POST_CASES)
def test_post_processing_matches_facexlib(case: str) -> None:
    facts, data = GOLDENS[case], golden(case)
    h, w = facts["input"]
    np.testing.assert_array_equal(prior_boxes(h, w), data["priors"])
    got = detections(
        data["loc"], data["conf"], data["landmarks"], h, w, facts["conf_threshold"], facts["nms_threshold"]
    )
    want = data["result"]
    print(f"{case}: {facts['above_threshold']} above the threshold, facexlib kept {len(want)}, sdkit {len(got)}")
    assert got.shape == want.shape and len(want) == facts["kept"]
    np.testing.assert_array_equal(got[:, 4], want[:, 4])  # the same faces, in the same order
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_detect_end_to_end_matches_facexlib(tmp_path: Path) -> None:
    """Random weights at loose thresholds: ``detect`` == facexlib's ``detect_faces`` rows."""
    case = "net_mobilenet025_33x47"
    facts, data = GOLDENS[case], golden(case)
    conf_t, nms_t = facts["loose_thresholds"]
    faces = detector(write_case(case, tmp_path), "reference").detect(data["image"], conf_t, nms_t)
    want = data["result"]
    assert len(faces) == facts["loose_kept"] == len(want) > 10
    assert all(isinstance(f, DetectedFace) and f.landmarks.shape == (5, 2) for f in faces)
    got = np.array([[*f.box, f.score, *f.landmarks.reshape(-1)] for f in faces], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bad_images_are_refused(tmp_path: Path) -> None:
    det = detector(write_case("net_mobilenet025_64x40", tmp_path, prefix=""), "reference")
    for bad in (np.zeros((8, 8, 3), np.float32), np.zeros((8, 8), np.uint8), np.zeros((1, 9, 3), np.uint8)):
        with pytest.raises(InputError):
            det.detect(bad)
    for thresholds in ((float("nan"), 0.4), (0.97, 1.5), (-0.1, 0.4)):
        with pytest.raises(InputError, match="threshold"):
            det.detect(np.zeros((20, 24, 3), np.uint8), *thresholds)
    assert det.detect(np.zeros((20, 24, 3), np.uint8), conf_threshold=0.999) == []
