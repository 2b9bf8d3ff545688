"""Real clients against ``sdkit serve`` with A1111's model folders, compared with the Python API.

The server runs in this process (``model_helpers.InProcessServer``, on a loopback port) so that
the tiny model families are registered in it, as sdkit-core's tests register them. Its
``--ckpt-dir`` holds A1111's layout: ``sd1.safetensors`` (the tiny SD 1.x checkpoint),
``sub/sd1_other.safetensors`` (the same with the UNet's last conv negated: another model of the
family), ``xl/`` with the tiny SDXL base and refiner, and ``broken.safetensors`` (not a
checkpoint); ``--vae-dir`` one VAE file. Every image is compared with what
``sdkit.load_pipeline(...).generate(...)`` makes from the same file and arguments, bit for bit.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from model_helpers import TINY_FAMILIES, InProcessServer, copy_into, tiny_families, write_variant
from PIL import Image
from serve_helpers import REPO, serve_backend, write_preview_decoder

from sdkit_serve.config import Limits, ServerConfig

SCHEMA = Path(__file__).parent / "data" / "a1111_api_schema.json"
BASE = {"prompt": "a red fox", "negative_prompt": "blurry", "seed": 11, "steps": 3, "cfg_scale": 6.0}
SIZE = {"width": 64, "height": 64}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    work = tmp_path_factory.mktemp("models")
    ckpt, vae = work / "Stable-diffusion", work / "VAE"
    copy_into(TINY_FAMILIES / "sd1" / "sd1_fp16.safetensors", ckpt / "sd1.safetensors")
    write_variant(TINY_FAMILIES / "sd1" / "sd1_fp16.safetensors", ckpt / "sub" / "sd1_other.safetensors")
    copy_into(TINY_FAMILIES / "sdxl" / "sdxl_fp16.safetensors", ckpt / "xl" / "base.safetensors")
    copy_into(TINY_FAMILIES / "sdxl_refiner" / "sdxl_refiner_fp16.safetensors", ckpt / "xl" / "refiner.safetensors")
    copy_into(REPO / "fixtures" / "tiny_xl" / "sd15", ckpt / "onnx" / "sd15")  # an optimum ONNX folder
    (ckpt / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}..")
    copy_into(TINY_FAMILIES / "sd1" / "vae" / "vae_ldm_fp16.safetensors", vae / "tiny_vae.safetensors")
    with pytest.MonkeyPatch.context() as patch, tiny_families():
        patch.setenv("SDKIT_ISOLATE", "0")  # compile in this process: the tiny families live here
        patch.setenv("SDKIT_CACHE_DIR", str(work / "cache"))
        config = ServerConfig(
            models=(ckpt / "sd1.safetensors",),
            ckpt_dir=ckpt,
            vae_dir=vae,
            backend=serve_backend(),
            limits=Limits(max_width=128, max_height=128),
            preview_decoder=write_preview_decoder(work / "preview.onnx"),
        )
        server = InProcessServer(config)
        server.ckpt, server.vae_dir = ckpt, vae  # type: ignore[attr-defined]
        try:
            yield server
        finally:
            server.stop()


PIPELINES: dict[Path, Any] = {}  # the Python API's pipelines, one per file, loaded once


@pytest.fixture(scope="module", autouse=True)
def _close_python_pipelines() -> Iterator[None]:
    yield
    while PIPELINES:
        PIPELINES.popitem()[1].close()


def python_api(path: Path, vae: Path | None = None, **generate: Any) -> np.ndarray:
    """The same generation through the Python API: ``sdkit.load_pipeline(path)`` (loaded
    here, apart from the server's), ``set_vae(vae)``, ``generate``."""
    import sdkit

    if path not in PIPELINES:
        PIPELINES[path] = sdkit.load_pipeline(path, backend=serve_backend())
    pipe = PIPELINES[path]
    if vae is None:
        return np.asarray(pipe.generate(**generate)[0])
    pipe.set_vae(vae)
    try:
        return np.asarray(pipe.generate(**generate)[0])
    finally:
        pipe.set_vae(None)


def pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def api_arguments(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": payload["prompt"], "negative_prompt": payload["negative_prompt"], "seed": payload["seed"],
        "steps": payload["steps"], "guidance_scale": payload["cfg_scale"], "width": 64, "height": 64,
        "sampler": payload.get("sampler_name", "Euler"),
    }  # fmt: skip


def test_webuiapi_switches_models_and_back_bit_for_bit(served: InProcessServer) -> None:
    """webuiapi (the A1111 client on PyPI): list the models, switch, generate, switch back."""
    import webuiapi  # in the test extra: CI installs it

    api = webuiapi.WebUIApi(host="127.0.0.1", port=served.port, sampler="Euler", steps=3)
    titles = api.util_get_model_names()
    sha = served.engine.catalog.checkpoints["sd1.safetensors"].sha256
    assert f"sd1.safetensors [{sha[:10]}]" in titles and "xl/refiner.safetensors" in titles
    assert api.util_get_current_model() == f"sd1.safetensors [{sha[:10]}]"
    kwargs = {**BASE, **SIZE, "sampler_name": "Euler"}
    first = np.asarray(api.txt2img(**kwargs).image.convert("RGB"))
    api.util_set_model("sd1_other")  # webuiapi picks the closest title and posts it
    assert api.util_get_current_model().startswith("sub/sd1_other.safetensors [")
    other = np.asarray(api.txt2img(**kwargs).image.convert("RGB"))
    api.util_set_model(f"sd1.safetensors [{sha[:10]}]")  # a title from the list: taken as it is
    back = np.asarray(api.txt2img(**kwargs).image.convert("RGB"))
    assert not np.array_equal(first, other), "another model must give another image"
    assert np.array_equal(first, back), "switching back must restore the image bit for bit"
    arguments = api_arguments(kwargs)
    assert np.array_equal(first, python_api(served.ckpt / "sd1.safetensors", **arguments))  # type: ignore[attr-defined]
    # the server refit the loaded pipeline with the other file's weights; Python loads it anew
    assert np.array_equal(other, python_api(served.ckpt / "sub" / "sd1_other.safetensors", **arguments))  # type: ignore[attr-defined]


def test_override_settings_vae_and_a_model_that_fails_to_load(served: InProcessServer) -> None:
    with served.client() as client:
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1", "sd_vae": "None"}).raise_for_status()
        payload = {**BASE, **SIZE}
        # another checkpoint of the family: the loaded pipeline takes its weights, nothing is loaded anew
        there = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1_other"}).json()
        assert there["switched"] and set(there["switched"].values()) <= {"refit", "recompile"}, there
        back = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1"}).json()
        assert set(back["switched"].values()) <= {"refit", "recompile"}
        plain = client.post("/sdapi/v1/txt2img", json=payload).json()
        override = {"sd_model_checkpoint": "sd1_other", "sd_vae": "tiny_vae.safetensors"}
        once = client.post("/sdapi/v1/txt2img", json={**payload, "override_settings": override}).json()
        assert client.get("/sdapi/v1/options").json()["sd_vae"] == "None"  # restored afterwards (the default)
        assert json.loads(once["info"])["sd_model_name"] == "sd1_other"
        again = client.post("/sdapi/v1/txt2img", json=payload).json()
        assert again["images"] == plain["images"]

        # a model that fails to load: a clear 400, the current model still selected and serving
        broken = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "broken.safetensors"})
        assert broken.status_code == 400 and broken.json()["error"] == "ModelFormatError"
        assert client.get("/sdapi/v1/options").json()["sd_model_checkpoint"].startswith("sd1.safetensors [")
        assert client.post("/sdapi/v1/txt2img", json=payload).json()["images"] == plain["images"]
        outside = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "../VAE/tiny_vae.safetensors"})
        assert outside.status_code == 400 and "unknown model" in outside.json()["detail"]
        kept = {
            "override_settings": {"sd_model_checkpoint": "sd1_other"},
            "override_settings_restore_afterwards": False,
        }
        client.post("/sdapi/v1/txt2img", json={**payload, **kept}).raise_for_status()
        assert client.get("/sdapi/v1/options").json()["sd_model_checkpoint"].startswith("sub/sd1_other")
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1.safetensors"}).raise_for_status()
    arguments = api_arguments(payload)
    vae = served.vae_dir / "tiny_vae.safetensors"  # type: ignore[attr-defined]
    other = served.ckpt / "sub" / "sd1_other.safetensors"  # type: ignore[attr-defined]
    assert np.array_equal(pixels(once["images"][0]), python_api(other, vae=vae, **arguments))
    assert not np.array_equal(pixels(once["images"][0]), pixels(plain["images"][0]))


def test_an_onnx_folder_in_the_model_folder(served: InProcessServer) -> None:
    payload = {**BASE, **SIZE}
    with served.client() as client:
        switched = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "onnx/sd15", "sd_vae": "None"})
        assert switched.json()["switched"] == {"pipeline": "loaded"}  # another format: loaded, then swapped in
        made = client.post("/sdapi/v1/txt2img", json=payload).json()
        vae = client.post("/sdapi/v1/options", json={"sd_vae": "tiny_vae.safetensors"})
        assert vae.status_code == 400 and "ONNX graphs" in vae.json()["detail"]
        assert client.get("/sdapi/v1/options").json()["sd_vae"] == "None"
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1"}).raise_for_status()
    assert json.loads(made["info"])["sd_model_name"] == "sd15"
    folder: Path = served.ckpt / "onnx" / "sd15"  # type: ignore[attr-defined]
    assert np.array_equal(pixels(made["images"][0]), python_api(folder, **api_arguments(payload)))


@pytest.mark.slow  # the SDXL base and refiner: ~20 s
def test_sdxl_refiner_from_the_model_folder(served: InProcessServer) -> None:
    payload = {**BASE, **SIZE, "steps": 4, "refiner_checkpoint": "xl/refiner", "refiner_switch_at": 0.5}
    with served.client() as client:
        refused = client.post("/sdapi/v1/txt2img", json=payload)  # the selected model is SD 1.x
        assert refused.status_code == 400 and "SDXL base" in refused.json()["detail"]
        made = client.post("/sdapi/v1/txt2img", json={**payload, "override_settings": {"sd_model_checkpoint": "base"}})
    assert made.status_code == 200, made.text
    import sdkit

    ckpt: Path = served.ckpt  # type: ignore[attr-defined]
    with sdkit.load_pipeline(ckpt / "xl" / "refiner.safetensors", backend=serve_backend()) as refiner:
        expected = python_api(
            ckpt / "xl" / "base.safetensors", refiner=refiner, refiner_switch_at=0.5, **api_arguments(payload)
        )
    assert np.array_equal(pixels(made.json()["images"][0]), expected)


def test_a_queued_request_runs_on_the_model_it_was_queued_for(served: InProcessServer) -> None:
    payload = {**BASE, **SIZE, "steps": 20, "sampler_name": "Euler"}
    results: dict[str, Any] = {}

    def post(key: str, path: str, body: dict[str, Any]) -> None:
        with served.client() as client:
            results[key] = client.post(path, json=body)

    with served.client() as client:
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1", "sd_vae": "None"}).raise_for_status()
        long_job = threading.Thread(target=post, args=("long", "/sdapi/v1/txt2img", payload))
        long_job.start()
        deadline = time.monotonic() + 60
        while client.get("/sdapi/v1/progress").json()["state"]["sampling_step"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        other = {"sd_model_checkpoint": "sd1_other"}
        switch = threading.Thread(target=post, args=("switch", "/sdapi/v1/options", other))
        switch.start()
        long_job.join(120)
        switch.join(120)
        assert results["switch"].status_code == 200
        after = client.post("/sdapi/v1/txt2img", json=payload).json()
        client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd1"}).raise_for_status()
        before = client.post("/sdapi/v1/txt2img", json=payload).json()
    assert results["long"].json()["images"] == before["images"], "the queued job ran on another model"
    assert after["images"] != before["images"]


def easy_diffusion_progress(base: str, task_id: str, seen: list[dict[str, Any]]) -> None:
    """Easy Diffusion's ``image_progress_thread``: POST /internal/progress every 0.5 s, retrying
    on 404, until ``completed``."""
    while True:
        response = httpx.post(
            f"{base}/internal/progress", json={"id_task": task_id, "live_preview": False, "id_live_preview": -1}
        )
        if response.status_code == 404:
            time.sleep(0.5)
            continue
        response.raise_for_status()
        seen.append(response.json())
        if response.json()["completed"] is True:
            return
        time.sleep(0.5)


def test_easy_diffusion_request_sequence(served: InProcessServer) -> None:
    """The requests Easy Diffusion's A1111 backend sends, in its order (easydiffusion/easydiffusion,
    ``ui/easydiffusion/backends/webui_common.py`` at 19c805ee, used by its ``webui`` and
    ``sdkit3`` backends):

    1. ``ping``: ``GET /internal/ping`` (1 s timeout); the first time, ``POST /sdapi/v1/options``
       with its defaults (``show_progress_every_n_steps: 3``, ``show_progress_grid: true``,
       ``live_previews_enable: false``, ``forge_additional_modules: []``), then
       ``GET /sdapi/v1/options`` (kept as ``webui_opts``).
    2. ``refresh_models``: ``POST /sdapi/v1/refresh-checkpoints`` and
       ``POST /sdapi/v1/refresh-vae-and-text-encoders`` (errors ignored).
    3. ``flush_model_changes``: ``POST /sdapi/v1/options`` with ``sd_model_checkpoint`` = the
       model's path relative to ED's ``models/stable-diffusion`` and ``forge_additional_modules`` =
       the VAE's path (or ``[]``); anything but 200 is an error.
    4. ``set_options`` (clip skip, preview settings): ``POST /sdapi/v1/options`` with
       ``CLIP_stop_at_last_layers`` and ``sd_model_checkpoint`` again; errors only printed.
    5. ``generate_images``: ``POST /sdapi/v1/txt2img`` with ``force_task_id`` (a uuid4),
       ``prompt``, ``negative_prompt``, ``sampler_name`` (its ``euler_a`` as ``Euler a``),
       ``scheduler`` (``simple``), ``steps``, ``seed``, ``cfg_scale``, ``distilled_cfg_scale``
       (3.5), ``batch_size``, ``width``, ``height``; meanwhile a thread polls
       ``POST /internal/progress`` ``{"id_task", "live_preview", "id_live_preview"}`` every 0.5 s
       until ``completed``; the answer's ``images`` are decoded and ``info``'s ``infotexts`` printed.
    6. ``stop_rendering``: ``POST /sdapi/v1/interrupt``.
    """
    base = served.url
    assert httpx.get(f"{base}/internal/ping", timeout=1).status_code == 200
    defaults = {"show_progress_every_n_steps": 3, "show_progress_grid": True, "live_previews_enable": False,
                "forge_additional_modules": []}  # fmt: skip
    assert httpx.post(f"{base}/sdapi/v1/options", json=defaults).status_code == 200
    webui_opts = httpx.get(f"{base}/sdapi/v1/options").json()
    assert webui_opts["live_previews_enable"] is False and webui_opts["samples_format"] == "png"
    for kind in ("checkpoints", "vae-and-text-encoders"):
        assert httpx.post(f"{base}/sdapi/v1/refresh-{kind}").status_code == 200
    vae = served.vae_dir / "tiny_vae.safetensors"  # type: ignore[attr-defined]
    model = {"sd_model_checkpoint": "sub/sd1_other.safetensors", "forge_additional_modules": [str(vae)]}
    assert httpx.post(f"{base}/sdapi/v1/options", json=model, timeout=300).status_code == 200
    clip = {"CLIP_stop_at_last_layers": 1, "sd_model_checkpoint": "sub/sd1_other.safetensors"}
    assert httpx.post(f"{base}/sdapi/v1/options", json=clip).status_code == 200
    task_id = "5d1f0c55-59d4-4a7e-8b4c-3a1c0e6d2f10"
    cmd = {"force_task_id": task_id, "prompt": "a lighthouse", "negative_prompt": "", "sampler_name": "Euler a",
           "scheduler": "simple", "steps": 6, "seed": 42, "cfg_scale": 7.5, "distilled_cfg_scale": 3.5,
           "batch_size": 1, "width": 64, "height": 64}  # fmt: skip
    seen: list[dict[str, Any]] = []
    progress = threading.Thread(target=easy_diffusion_progress, args=(base, task_id, seen))
    progress.start()
    response = httpx.post(f"{base}/sdapi/v1/txt2img", json=cmd, timeout=300)
    progress.join(60)
    assert response.status_code == 200, response.text
    assert len(json.loads(response.json()["info"])["infotexts"]) == 1
    assert seen and seen[-1]["completed"] is True and not progress.is_alive()
    assert httpx.post(f"{base}/sdapi/v1/interrupt").status_code == 200
    expected = python_api(
        served.ckpt / "sub" / "sd1_other.safetensors", vae=vae, prompt="a lighthouse", negative_prompt="",  # type: ignore[attr-defined]
        sampler="Euler a", schedule="simple", steps=6, seed=42, guidance_scale=7.5, width=64, height=64,
    )  # fmt: skip
    assert np.array_equal(pixels(response.json()["images"][0]), expected)
    httpx.post(f"{base}/sdapi/v1/options", json={"sd_model_checkpoint": "sd1", "sd_vae": "None"}, timeout=300)


def test_progress_by_task_id_png_info_memory_and_limits(served: InProcessServer) -> None:
    task_id = "my-task"
    with served.client() as client:
        unknown = client.post("/internal/progress", json={"id_task": "never-sent"}).json()
        assert unknown == {"active": False, "queued": False, "completed": False, "progress": None, "eta": None,
                           "live_preview": None, "id_live_preview": -1, "textinfo": "Waiting..."}  # fmt: skip
        made = client.post("/sdapi/v1/txt2img", json={**BASE, **SIZE, "force_task_id": task_id}).json()
        done = client.post("/internal/progress", json={"id_task": task_id}).json()
        assert done["completed"] is True and done["active"] is False
        info = client.post("/sdapi/v1/png-info", json={"image": made["images"][0]}).json()
        infotext = json.loads(made["info"])["infotexts"][0]
        assert info["info"] == infotext and info["parameters"]["Seed"] == "11"
        assert info["parameters"]["Prompt"] == "a red fox" and info["parameters"]["Size-1"] == "64"
        bad = client.post("/sdapi/v1/png-info", json={"image": "bm90IGFuIGltYWdl"})
        assert bad.status_code == 400
        memory = client.get("/sdapi/v1/memory").json()
        assert set(memory) == {"ram", "cuda"}
        # a file added to the folder is listed after refresh-checkpoints
        ckpt: Path = served.ckpt  # type: ignore[attr-defined]
        copy_into(ckpt / "sd1.safetensors", ckpt / "later" / "new.safetensors")
        names = [m["filename"] for m in client.get("/sdapi/v1/sd-models").json()]
        assert "later/new.safetensors" not in names
        client.post("/sdapi/v1/refresh-checkpoints").raise_for_status()
        names = [m["filename"] for m in client.get("/sdapi/v1/sd-models").json()]
        assert "later/new.safetensors" in names
        # img2img without a size runs at the init image's: checked against --max-width (issue 30)
        wide = Image.new("RGB", (192, 64), "white")
        buffer = io.BytesIO()
        wide.save(buffer, format="PNG")
        init = base64.b64encode(buffer.getvalue()).decode()
        over = client.post("/sdapi/v1/img2img", json={**BASE, "init_images": [init]})
        assert over.status_code == 400 and "width 192 is over" in over.json()["detail"]
        assert "--max-width" in over.json()["detail"]


def test_internal_progress_sends_each_preview_once(served: InProcessServer) -> None:
    """A1111 1.6+'s live previews: a data URL with its ``id_live_preview``; sending that id back
    gives no image until a newer step; ``live_previews_enable: false`` (Easy Diffusion's default)
    sends none."""
    task_id = "preview-task"
    thread = threading.Thread(
        target=lambda: httpx.post(
            f"{served.url}/sdapi/v1/txt2img", json={**BASE, **SIZE, "steps": 60, "force_task_id": task_id}, timeout=300
        )
    )
    with served.client() as client:
        client.post("/sdapi/v1/options", json={"live_previews_enable": True}).raise_for_status()
        thread.start()
        deadline = time.monotonic() + 60
        while not (state := client.post("/internal/progress", json={"id_task": task_id}).json())["active"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        while (state := client.post("/internal/progress", json={"id_task": task_id}).json())["live_preview"] is None:
            assert time.monotonic() < deadline and state["active"]
            time.sleep(0.02)
        assert state["live_preview"].startswith("data:image/png;base64,") and state["id_live_preview"] >= 0
        assert 0 < state["progress"] < 1 and state["eta"] is not None
        seen = client.post("/internal/progress", json={"id_task": task_id, "id_live_preview": 10**9}).json()
        same = {"id_task": task_id, "id_live_preview": seen["id_live_preview"]}
        repeat = client.post("/internal/progress", json=same).json()
        assert repeat["live_preview"] is None or repeat["id_live_preview"] > seen["id_live_preview"]
        client.post("/sdapi/v1/options", json={"live_previews_enable": False}).raise_for_status()
        off = client.post("/internal/progress", json={"id_task": task_id}).json()
        client.post("/sdapi/v1/interrupt")
    thread.join(60)
    assert off["live_preview"] is None or not off["active"]
    preview = pixels(state["live_preview"].split(",", 1)[1])  # the tiny decoder: 2x the latents
    assert preview.ndim == 3 and preview.shape[0] == preview.shape[1] > 0


def json_type(schema: dict[str, Any], components: dict[str, Any]) -> set[str]:
    """The JSON types a property allows, null left out, ``$ref``s resolved."""
    if "$ref" in schema:
        return json_type(components[schema["$ref"].rsplit("/", 1)[-1]], components)
    if "anyOf" in schema:
        return set().union(*(json_type(s, components) for s in schema["anyOf"])) - {"null"}
    if "type" in schema:
        return {schema["type"]} - {"null"}
    return {"object"} if "properties" in schema else set()


def properties(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return properties(components[schema["$ref"].rsplit("/", 1)[-1]], components)
    if schema.get("type") == "array":
        return properties(schema["items"], components)
    return dict(schema.get("properties", {}))


def test_openapi_agrees_with_a1111(served: InProcessServer) -> None:
    """Every path we serve is one of A1111's (or its built-in extensions'), and every field we
    declare on the request and response models A1111 has has its name and JSON type there
    (``tests/data/a1111_api_schema.json``: provenance in its ``about`` and ``sources``)."""
    a1111 = json.loads(SCHEMA.read_text())
    with served.client() as client:
        ours = client.get("/openapi.json").json()
    components = ours["components"]["schemas"]
    served_paths = {f"{m.upper()} {p}" for p, ops in ours["paths"].items() for m in ops}
    assert served_paths <= set(a1111["paths"]), f"not A1111 paths: {sorted(served_paths - set(a1111['paths']))}"
    compared = 0
    for key, fields in a1111["fields"].items():
        method, path, part = key.split(" ", 2)
        operation = ours["paths"].get(path, {}).get(method.lower())
        if operation is None:
            continue
        if part == "request":
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
        else:
            schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
        for name, spec in properties(schema, components).items():
            assert name in fields, f"{key}: {name!r} is not an A1111 field"
            assert fields[name] in json_type(spec, components), f"{key}: {name} is {spec}, A1111's is {fields[name]}"
            compared += 1
    assert compared >= 80, compared  # 86 on 2026-11-28; more as fields are added
