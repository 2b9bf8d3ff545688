"""A1111's Extras endpoints in-process (FastAPI's TestClient on ``create_app``; no pipeline is
loaded: extras need none): shapes, the upscalers listing, Lanczos as A1111's ``Upscaler.upscale``
does it, an ESRGAN-family file by A1111's name (its numbers are held to spandrel in sdkit-core's
``tests/pipelines/test_upscaler.py``), and refusals as JSON 4xx."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from safetensors.numpy import save_file

from sdkit_serve.app import create_app
from sdkit_serve.config import ServerConfig
from sdkit_serve.engine import Engine

REPO = Path(__file__).resolve().parents[3]
GOLDENS = REPO / "fixtures" / "upscalers" / "goldens.json"


def b64png(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def png(text: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(text)))


def compact_file(folder: Path) -> Path:
    """A random-weight realesr-animevideov3-sized file (a shipped graph): seeded like the
    spandrel goldens' (the values are irrelevant here, only that it runs)."""
    facts: dict[str, Any] = json.loads(GOLDENS.read_text())["cases"]["full_animevideov3"]
    rng = np.random.default_rng(0)
    values = {}
    for key, shape in facts["entries"]:
        scale = 1.0 / np.sqrt(np.prod(shape[1:])) if len(shape) > 1 else 0.1
        values[key] = ((rng.random(shape, dtype=np.float32) * 2 - 1) * np.float32(scale)).astype(np.float32)
    path = folder / "realesr-animevideov3.safetensors"
    save_file(values, str(path))
    return path


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = tmp_path / "upscalers"
    folder.mkdir()
    compact_file(folder)
    (folder / "broken.safetensors").write_bytes(b"not a file")
    monkeypatch.setenv("SDKIT_UPSCALER_DIR", str(folder))
    monkeypatch.setenv("SDKIT_ISOLATE", "0")  # a child process per compile: not needed here
    engine = Engine(ServerConfig(models=(tmp_path,), backend="reference"))
    # a loopback Host: the server refuses other names when it has no API key (DNS rebinding)
    with TestClient(create_app(engine), base_url="http://127.0.0.1") as test_client:
        yield test_client
    engine.close()


def test_upscalers_lists_model_free_and_files(client: TestClient) -> None:
    items = client.get("/sdapi/v1/upscalers").json()
    assert [i["name"] for i in items] == ["None", "Lanczos", "Nearest", "R-ESRGAN AnimeVideo"]
    assert items[3]["scale"] == 4 and items[3]["model_name"] == "realesr-animevideov3"


def test_single_image_lanczos_and_model(client: TestClient) -> None:
    source = Image.fromarray(np.random.default_rng(1).integers(0, 256, (12, 20, 3), dtype=np.uint8))
    body = {"image": b64png(source), "upscaler_1": "Lanczos", "upscaling_resize": 2}
    reply = client.post("/sdapi/v1/extra-single-image", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert set(data) == {"html_info", "image"} and "Postprocess upscale by: 2" in data["html_info"]
    got = png(data["image"])
    want = source.resize((40, 24), Image.Resampling.LANCZOS)
    assert np.array_equal(np.asarray(got.convert("RGB")), np.asarray(want))
    body = {"image": b64png(source), "upscaler_1": "R-ESRGAN AnimeVideo", "resize_mode": 1}
    body |= {"upscaling_resize_w": 48, "upscaling_resize_h": 40, "upscaling_crop": True}
    reply = client.post("/sdapi/v1/extra-single-image", json=body)
    assert reply.status_code == 200, reply.text
    assert png(reply.json()["image"]).size == (48, 40)


def test_batch_images_and_blend(client: TestClient) -> None:
    source = Image.fromarray(np.random.default_rng(2).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    body = {
        "imageList": [{"data": b64png(source), "name": "a.png"}, {"data": b64png(source), "name": "b.png"}],
        "upscaler_1": "Nearest",
        "upscaler_2": "Lanczos",
        "extras_upscaler_2_visibility": 0.5,
        "upscaling_resize": 1.5,
    }
    reply = client.post("/sdapi/v1/extra-batch-images", json=body)
    assert reply.status_code == 200, reply.text
    images = [png(i).convert("RGB") for i in reply.json()["images"]]
    near = source.resize((24, 24), Image.Resampling.NEAREST)
    lanczos = source.resize((24, 24), Image.Resampling.LANCZOS)
    want = np.asarray(Image.blend(near, lanczos, 0.5))
    assert len(images) == 2 and all(np.array_equal(np.asarray(i), want) for i in images)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"upscaler_1": "R-ESRGAN 4x+"}, 400, "unknown upscaler"),
        ({"upscaler_1": "Lanczos", "gfpgan_visibility": 1}, 400, "gfpgan_visibility: this server has no GFPGAN"),
        ({"codeformer_visibility": 0.5}, 400, "codeformer_visibility: this server has no CodeFormer"),
        ({"upscaler_1": "Lanczos", "image": "not base64!"}, 400, "not valid base64"),
        ({"upscaler_1": "Lanczos", "upscaling_resize": 0}, 422, "upscaling_resize"),
    ],
)
def test_refusals_are_json(client: TestClient, body: dict[str, Any], status: int, words: str) -> None:
    source = b64png(Image.new("RGB", (8, 8)))
    reply = client.post("/sdapi/v1/extra-single-image", json={"image": source, **body})
    assert reply.status_code == status and words in reply.json()["detail"]


def test_clients_name_upscalers_never_paths(client: TestClient, tmp_path: Path) -> None:
    """Issue 30's second pass (``tools/bad_inputs.py``): ``upscaler_1`` took any path on the
    server (``/elsewhere/x.safetensors`` was loaded; ``../x`` answered whether a file exists), the
    refusal named the upscaler folder's absolute path, and so did ``/sdapi/v1/upscalers``."""
    elsewhere = compact_file(tmp_path)  # a readable upscaler outside the folder
    source = b64png(Image.new("RGB", (8, 8)))
    for name in (str(elsewhere), "../realesr-animevideov3.safetensors", "realesr-animevideov3.safetensors"):
        reply = client.post("/sdapi/v1/extra-single-image", json={"image": source, "upscaler_1": name})
        assert reply.status_code == 400, reply.text
        detail = reply.json()["detail"]
        assert detail.startswith(f"unknown upscaler {name!r}; this server has: None, Lanczos, Nearest, R-ESRGAN")
        assert str(tmp_path) not in detail.replace(name, "")
    items = client.get("/sdapi/v1/upscalers").json()
    assert items[3]["model_path"] == "realesr-animevideov3.safetensors"
    assert not any(str(tmp_path) in json.dumps(i) for i in items)
    reply = client.post("/sdapi/v1/png-info", json={"image": base64.b64encode(b"GIF89a no").decode()})
    assert reply.status_code == 400 and "BytesIO" not in reply.json()["detail"]
