"""The server's face restoration on real files (``-m slow``; issue 29, item 2): ``restore_faces:
true`` on txt2img with ``face_dir`` (the default restorer, CodeFormer, found by A1111's file
name) and Extras' ``gfpgan_visibility`` / ``codeformer_visibility`` in one request. The files are
``fixtures/faces/e2e/e2e_weights.py``'s (a crafted RetinaFace that finds two faces, ParseNet,
tiny 64 px GFPGAN and CodeFormer; ``packages/sdkit-core/tests/pipelines/test_faces_e2e.py`` holds
them to facexlib + spandrel). A smoke check: the networks run, the answers name the restorers,
and Extras' result equals ``sdkit.restore_faces`` run twice in A1111's order."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import sdkit
from sdkit.pipelines.stages import faces
from sdkit_serve.app import create_app
from sdkit_serve.config import ServerConfig
from sdkit_serve.engine import Engine

ROOT = Path(__file__).resolve().parents[3]
E2E = ROOT / "fixtures" / "faces" / "e2e"


def _weights() -> Any:
    spec = importlib.util.spec_from_file_location("e2e_weights", E2E / "e2e_weights.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 68 s on the loaded 2-vCPU machine: eight 512 px ParseNet runs, the tiny pipeline
def test_server_restores_faces_with_real_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("a smoke check of the server's face wiring on real files: pytest -m slow")
    weights = _weights()
    files = weights.write_files(tmp_path)
    (tmp_path / "graphs").mkdir()
    graphs = weights.graph_folder(tmp_path / "graphs", faces._family("gfpgan").graphs_dir())
    for family in ("gfpgan", "codeformer"):
        monkeypatch.setattr(f"sdkit.families.{family}.graphs_dir", lambda: graphs)
    monkeypatch.setattr(faces, "_LOADED", {})
    engine = Engine(ServerConfig(models=(ROOT / "fixtures" / "tiny_pipeline" / "model",), face_dir=tmp_path))
    source = io.BytesIO()
    photo = Image.open(E2E / "photo.png").convert("RGB")
    photo.save(source, format="PNG")
    extras = {
        "image": base64.b64encode(source.getvalue()).decode(),
        "gfpgan_visibility": 1.0,
        "codeformer_visibility": 0.6,
        "codeformer_weight": 0.7,
    }
    txt2img = {"prompt": "a face", "steps": 2, "seed": 1, "width": 64, "height": 64, "restore_faces": True}
    with TestClient(create_app(engine), base_url="http://127.0.0.1") as client:  # a loopback Host
        reply = client.post("/sdapi/v1/extra-single-image", json=extras)
        generated = client.post("/sdapi/v1/txt2img", json=txt2img)
        plain = client.post("/sdapi/v1/txt2img", json={**txt2img, "restore_faces": False})
    engine.close()
    assert reply.status_code == 200, reply.text
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply.json()["image"]))).convert("RGB"))
    step = sdkit.restore_faces(photo, files["gfpgan"])
    want = sdkit.restore_faces(step, files["codeformer"], fidelity=0.7, visibility=0.6)
    assert np.array_equal(got, np.asarray(want))
    assert "GFPGAN visibility: 1" in reply.json()["html_info"] and "CodeFormer weight: 0.7" in reply.json()["html_info"]
    assert generated.status_code == 200 and plain.status_code == 200, generated.text + plain.text
    assert "Face restoration: CodeFormer" in json.loads(generated.json()["info"])["infotexts"][0]
    images = [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))).convert("RGB"))
        for r in (generated, plain)
    ]
    assert np.mean(np.abs(images[0].astype(int) - images[1]).max(axis=2) > 2) > 0.1  # two faces pasted
