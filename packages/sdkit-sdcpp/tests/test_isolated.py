"""stable-diffusion.cpp in a child process (``isolate=True``, on in ``sdkit serve``): a cancel inside
an image stops it at once, and the next request runs; and ``sdkit serve --backend sdcpp`` through
the A1111 API. On the full-size random SD 1.5 file (``-m slow``)."""

from __future__ import annotations

import base64
import io
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sdcpp_checkpoints import write_lora
from sdcpp_helpers import needs_binding

import sdkit

pytestmark = [needs_binding, pytest.mark.slow]
THREADS = 2
SERVE_TESTS = Path(__file__).resolve().parents[2] / "sdkit-serve" / "tests"


class Cancelled(Exception):
    """What a caller's step callback raises to stop a generation (``sdkit serve``: JobCancelled)."""


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_a_cancel_at_step_k_stops_at_once_and_the_next_request_runs(sd15: Path) -> None:
    request: dict[str, Any] = {"seed": 3, "width": 64, "height": 64, "sampler": "euler"}
    with sdkit.load_pipeline(sd15, backend="sdcpp", threads=THREADS, isolate=True) as pipe:
        start = time.perf_counter()
        [before] = pipe.generate("a cat", steps=5, **request)
        whole = time.perf_counter() - start
        seen: list[tuple[int, int]] = []
        raised: list[float] = []

        def cancel_at_2(step: int, steps: int, _: Any) -> None:
            seen.append((step, steps))
            if step == 2:
                raised.append(time.perf_counter())
                raise Cancelled

        with pytest.raises(Cancelled):
            pipe.generate("a cat", steps=5, callback=cancel_at_2, **request)
        returned_after = time.perf_counter() - raised[0]
        assert seen == [(0, 5), (1, 5), (2, 5)]
        print(f"5 steps and the decode: {whole:.2f} s; returned {returned_after:.3f} s after the cancel at step 2")
        assert returned_after < min(1.0, whole / 4)  # the child killed, not 2 steps and a decode run out
        assert not pipe.context.loaded
        [after] = pipe.generate("a cat", steps=5, **request)  # a new child, the model loaded again
        assert np.array_equal(_pixels(after), _pixels(before))
    with sdkit.load_pipeline(sd15, backend="sdcpp", threads=THREADS, isolate=False) as local:
        [in_process] = local.generate("a cat", steps=5, **request)
    assert np.array_equal(_pixels(in_process), _pixels(before))  # the child's image is this process's


def _interrupt(server: Any, client: Any, body: dict[str, Any]) -> tuple[float, float, int, Any]:
    """POST ``body`` in a thread, ``/sdapi/v1/interrupt`` once two steps are done: (seconds from
    the interrupt to the answer, seconds per step, steps left, the answer)."""
    result: dict[str, Any] = {}

    def post() -> None:
        with server.client() as own:
            result["answer"] = own.post("/sdapi/v1/txt2img", json=body)
            result["time"] = time.monotonic()

    thread = threading.Thread(target=post)
    thread.start()
    marks = []
    while len(marks) < 2:
        state = client.get("/sdapi/v1/progress", params={"skip_current_image": True}).json()["state"]
        step = state["sampling_step"]
        if state["sampling_steps"] == body["steps"] and step >= 1 and (not marks or step > marks[-1][1]):
            marks.append((time.monotonic(), step))
        time.sleep(0.02)
    asked = time.monotonic()
    assert client.post("/sdapi/v1/interrupt").json() == {"interrupted": True}
    thread.join(300)
    step_s = (marks[1][0] - marks[0][0]) / (marks[1][1] - marks[0][1])
    return result["time"] - asked, step_s, body["steps"] - marks[1][1], result["answer"]


def test_serve_backend_sdcpp_through_the_a1111_api(sd15: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(SERVE_TESTS))
    try:
        from serve_helpers import ServerProcess
    finally:
        sys.path.remove(str(SERVE_TESTS))
    loras = tmp_path / "loras"
    loras.mkdir()
    lora = write_lora(loras / "style.safetensors")
    args = ["--model", str(sd15), "--backend", "sdcpp", "--lora-dir", str(loras), "--log-level", "warning"]
    server = ServerProcess(args, tmp_path / "server.log")  # isolation on, as a server runs
    body = {
        "prompt": "a cat <lora:style:0.8>", "negative_prompt": "blurry", "seed": 9, "steps": 3, "width": 64,
        "height": 64, "sampler_name": "DPM++ 2M", "scheduler": "Karras", "cfg_scale": 5,
    }  # fmt: skip
    try:
        server.wait_ready(timeout=300)
        with server.client() as client:
            answer = client.post("/sdapi/v1/txt2img", json=body)
            assert answer.status_code == 200, answer.text
            data = answer.json()
            served = Image.open(io.BytesIO(base64.b64decode(data["images"][0])))
            info = data["info"]
            bad = client.post("/sdapi/v1/txt2img", json={**body, "sampler_name": "DPM++ 2M SDE"})
            interrupted = _interrupt(server, client, {**body, "steps": 12})
            again = client.post("/sdapi/v1/txt2img", json=body)  # a new child, the model loaded again
    finally:
        server.stop()
    latency, step_s, left, answer = interrupted
    print(f"/interrupt: answered {latency:.2f} s after it; a step takes {step_s:.2f} s; {left} steps were left")
    assert answer.status_code == 200 and answer.json()["images"] == []
    assert json.loads(answer.json()["info"])["interrupted"] is True
    assert latency < left * step_s / 2  # stopped long before its end, not run out
    assert again.status_code == 200 and again.json()["images"] == data["images"]
    assert '"sampler_name": "DPM++ 2M"' in info and "Schedule type: Karras" in info and "style: 0.8" in info
    assert bad.status_code == 400 and "sampler 'dpmpp_2m_sde'" in bad.text  # refused naming it, not run as another
    with sdkit.load_pipeline(sd15, backend="sdcpp") as pipe:  # the plugin in process (= the binding)
        pipe.set_loras([(lora, 0.8)])
        [expected] = pipe.generate(
            "a cat", negative_prompt="blurry", seed=9, steps=3, width=64, height=64, sampler="DPM++ 2M Karras",
            guidance_scale=5.0,
        )  # fmt: skip
    assert np.array_equal(_pixels(served), _pixels(expected))
