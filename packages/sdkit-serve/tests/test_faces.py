"""Face restoration on the server (``sdkit_serve.faces``): ``restore_faces`` and its A1111
settings mapped onto ``GenerationRequest.restore_faces`` / ``codeformer_weight`` (or refused
naming the field), and the Extras' GFPGAN / CodeFormer steps in-process with stand-ins for the
networks that follow the faces contract (the networks' numbers are held to their oracles in
sdkit-core; the paste-back to facexlib in ``tests/pipelines/test_faces.py``)."""

from __future__ import annotations

import base64
import io
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from safetensors.numpy import save_file

from sdkit.errors import InputError
from sdkit.pipelines.stages import faces
from sdkit_serve.a1111 import Inputs, Txt2ImgRequest, plan_generation
from sdkit_serve.app import create_app
from sdkit_serve.config import Limits, ServerConfig
from sdkit_serve.engine import Engine
from sdkit_serve.faces import FaceSettings, generation_fields

GFPGAN_KEY, CODEFORMER_KEY = "stylegan_decoder.final_conv.weight", "quantize.embedding.weight"


def _file(path: Path, key: str) -> None:
    save_file({key: np.zeros((2, 2), dtype=np.float32)}, str(path))


@pytest.fixture
def face_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "faces"
    folder.mkdir()
    _file(folder / "GFPGANv1.4.safetensors", GFPGAN_KEY)
    _file(folder / "codeformer-v0.1.0.safetensors", CODEFORMER_KEY)
    _file(folder / "detection_Resnet50_Final.safetensors", "body.conv1.weight")
    _file(folder / "parsing_parsenet.safetensors", "encoder.0.weight")
    return folder


def test_restore_faces_maps_onto_the_request(face_dir: Path) -> None:
    settings = FaceSettings(face_dir)
    fields, ignored = generation_fields(True, None, settings)
    assert fields == {"restore_faces": str(face_dir / "codeformer-v0.1.0.safetensors"), "codeformer_weight": 0.5}
    assert ignored == {}
    fields, _ = generation_fields(True, {"code_former_weight": 0.3}, settings)
    assert fields["codeformer_weight"] == 0.3
    fields, ignored = generation_fields(True, {"face_restoration_model": "GFPGAN", "code_former_weight": 0.3}, settings)
    assert fields == {"restore_faces": str(face_dir / "GFPGANv1.4.safetensors")}
    assert ignored == {"override_settings.code_former_weight": "applies to CodeFormer, not GFPGAN"}
    assert generation_fields(True, None, FaceSettings(face_dir, "GFPGAN"))[0]["restore_faces"].endswith(
        "GFPGANv1.4.safetensors"
    )
    fields, ignored = generation_fields(False, {"face_restoration_model": "GFPGAN"}, settings)
    assert fields == {} and set(ignored) == {"override_settings.face_restoration_model"}
    assert generation_fields(None, None, None) == ({}, {})


@pytest.mark.parametrize(
    ("overrides", "settings", "words"),
    [
        (None, None, "restore_faces: this server has no face restorer"),
        ({"face_restoration_model": "RestoreFormer"}, "dir", "override_settings.face_restoration_model: unknown"),
        ({"code_former_weight": 2}, "dir", r"code_former_weight must be in \[0, 1\]"),
        (None, "gfpgan-only", None),
        ({"face_restoration_model": "CodeFormer"}, "gfpgan-only", "no CodeFormer face restorer"),
    ],
)
def test_restore_faces_refusals_name_the_field(
    face_dir: Path, overrides: Any, settings: Any, words: str | None
) -> None:
    if settings == "gfpgan-only":
        (face_dir / "codeformer-v0.1.0.safetensors").unlink()
    config = None if settings is None else FaceSettings(face_dir)
    if words is None:  # only GFPGAN there: the default falls to it
        assert generation_fields(True, overrides, config)[0]["restore_faces"].endswith("GFPGANv1.4.safetensors")
        return
    with pytest.raises(InputError, match=words):
        generation_fields(True, overrides, config)


def test_plan_generation_carries_the_restorer(face_dir: Path) -> None:
    payload = Txt2ImgRequest(
        prompt="a face",
        restore_faces=True,
        override_settings={"face_restoration_model": "CodeFormer", "code_former_weight": 0.25},
    )
    plan = plan_generation(payload, Limits(), Inputs(faces=FaceSettings(face_dir)))
    assert plan.generate["restore_faces"].endswith("codeformer-v0.1.0.safetensors")
    assert plan.generate["codeformer_weight"] == 0.25 and plan.ignored == {}
    with pytest.raises(InputError, match="restore_faces"):
        plan_generation(Txt2ImgRequest(prompt="a face", restore_faces=True), Limits(), Inputs())


class Detector:
    def __init__(self, path: Path, backend: str = "auto", device: Any = None) -> None:
        pass

    def detect(self, image: np.ndarray, conf_threshold: float = 0.97, nms_threshold: float = 0.4) -> list[Any]:
        side = min(image.shape[:2])
        centred = (faces.FACE_TEMPLATE - 256) * (side / 900) + np.array(image.shape[1::-1]) / 2
        return [types.SimpleNamespace(box=(0.0, 0.0, 1.0, 1.0), score=0.99, landmarks=centred.astype(np.float32))]


class Parser:
    size = 512

    def __init__(self, path: Path, backend: str = "auto", device: Any = None) -> None:
        y, x = np.mgrid[0:512, 0:512]
        self.classes = np.where(((x - 256) / 170) ** 2 + ((y - 280) / 215) ** 2 < 1, 1, 0)

    def parse(self, face: np.ndarray) -> np.ndarray:
        return self.classes


class Darken:
    name, size, takes_fidelity = "GFPGAN", 512, False

    def __init__(self, path: Path, backend: str = "auto", device: Any = None) -> None:
        pass

    def restore(self, face: np.ndarray, fidelity: float | None = None) -> np.ndarray:
        return np.asarray(face * np.float32(0.5), dtype=np.float32)


class Weighted(Darken):
    name, takes_fidelity = "CodeFormer", True

    def restore(self, face: np.ndarray, fidelity: float | None = None) -> np.ndarray:
        return np.asarray(1 - face * np.float32(0.5 if fidelity is None else fidelity), dtype=np.float32)


@pytest.fixture
def networks(monkeypatch: pytest.MonkeyPatch) -> Any:
    def module(**attrs: Any) -> types.ModuleType:
        out = types.ModuleType("stand_in")
        out.__dict__.update(attrs)
        return out

    monkeypatch.setitem(sys.modules, "sdkit.families.gfpgan", module(sniff=lambda s: {} if GFPGAN_KEY in s else None))
    monkeypatch.setitem(
        sys.modules, "sdkit.families.codeformer", module(sniff=lambda s: {} if CODEFORMER_KEY in s else None)
    )
    monkeypatch.setitem(sys.modules, "sdkit.families.retinaface", module(sniff=lambda s: {}))
    monkeypatch.setitem(sys.modules, "sdkit.families.parsenet", module(sniff=lambda s: {}))
    monkeypatch.setitem(sys.modules, "sdkit.pipelines.stages.gfpgan", module(GFPGANRestorer=Darken))
    monkeypatch.setitem(sys.modules, "sdkit.pipelines.stages.codeformer", module(CodeFormerRestorer=Weighted))
    monkeypatch.setitem(sys.modules, "sdkit.pipelines.stages.retinaface", module(RetinaFaceDetector=Detector))
    monkeypatch.setitem(sys.modules, "sdkit.pipelines.stages.parsenet", module(ParseNetParser=Parser))
    faces._LOADED.clear()
    yield
    faces._LOADED.clear()


def test_extras_restore_after_upscaling_in_a1111_order(networks: None, face_dir: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    source = Image.fromarray(rng.integers(0, 256, (96, 80, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    engine = Engine(ServerConfig(models=(tmp_path,), backend="reference", face_dir=face_dir))
    body = {
        "image": base64.b64encode(buffer.getvalue()).decode(),
        "upscaler_1": "Lanczos",
        "upscaling_resize": 2,
        "gfpgan_visibility": 0.5,
        "codeformer_visibility": 0.7,
        "codeformer_weight": 0.2,
    }
    with TestClient(create_app(engine), base_url="http://127.0.0.1") as client:  # a loopback Host
        reply = client.post("/sdapi/v1/extra-single-image", json=body)
    engine.close()
    assert reply.status_code == 200, reply.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply.json()["image"]))).convert("RGB"))
    upscaled = source.resize((160, 192), Image.Resampling.LANCZOS)
    step, _ = faces.restore_faces(upscaled, Darken(Path()), Detector(Path()), Parser(Path()), visibility=0.5)
    want, count = faces.restore_faces(step, Weighted(Path()), Detector(Path()), Parser(Path()), 0.2, 0.7)
    assert count == 1 and np.array_equal(got, np.asarray(want))
    assert "GFPGAN visibility: 0.5, CodeFormer visibility: 0.7, CodeFormer weight: 0.2" in reply.json()["html_info"]


def test_options_keep_the_face_settings(face_dir: Path, tmp_path: Path) -> None:
    engine = Engine(ServerConfig(models=(tmp_path,), backend="reference", face_dir=face_dir))
    assert engine.face_settings == FaceSettings(face_dir, None, 0.5)
    from sdkit_serve.model_routes import set_plain_options

    ignored: dict[str, str] = {}
    set_plain_options(engine, {"face_restoration_model": "GFPGAN", "code_former_weight": 0.8}, ignored)
    assert ignored == {} and engine.face_settings == FaceSettings(face_dir, "GFPGAN", 0.8)
    set_plain_options(engine, {"face_restoration_model": "RestoreFormer", "code_former_weight": 3}, ignored)
    assert set(ignored) == {"face_restoration_model", "code_former_weight"}
    assert engine.face_settings == FaceSettings(face_dir, "GFPGAN", 0.8)
    fields, _ = generation_fields(True, None, engine.face_settings)
    assert fields == {"restore_faces": str(face_dir / "GFPGANv1.4.safetensors")}
    engine.close()
