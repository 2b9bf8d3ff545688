"""``sdkit serve --ray --replicas 2``: the app on a local Ray cluster of two CPU replicas, started
as a user would. Both replicas must answer the same request with the same image (the one the
pipeline makes in-process).

Needs ``sdkit-serve[ray]``; marked ``ray`` (a Ray cluster takes tens of seconds to start)."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from serve_helpers import ServerProcess

pytestmark = pytest.mark.ray

REQUEST = {"prompt": "a lighthouse", "steps": 4, "seed": 11, "sampler_name": "Euler a", "cfg_scale": 6}


def post_pair(url: str) -> list[dict[str, Any]]:
    """Two requests at once, so Ray's router has reason to use both replicas."""
    bodies: list[dict[str, Any]] = []

    def post() -> None:
        response = httpx.post(f"{url}/sdapi/v1/txt2img", json=REQUEST, timeout=600)
        assert response.status_code == 200, response.text
        bodies.append(response.json())

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return bodies


def test_two_replicas_answer_with_the_same_image(tiny: Path, backend: str, tmp_path: Path) -> None:
    pytest.importorskip("ray.serve")
    started = time.monotonic()
    args = ["--ray", "--replicas", "2", "--cpus-per-replica", "1", "--model", str(tiny), "--backend", backend]
    server = ServerProcess([*args, "--threads", "1", "--log-level", "warning"], tmp_path / "ray.log", isolate=False)
    try:
        server.wait_ready(timeout=300)
        ready = time.monotonic() - started
        images: dict[str, str] = {}
        for _ in range(10):
            for body in post_pair(server.url):
                images.setdefault(json.loads(body["info"])["worker"], body["images"][0])
            if len(images) == 2:
                break
        print(f"Ray: `sdkit serve --ray --replicas 2` answered after {ready:.1f} s; workers {sorted(images)}")
    finally:
        server.stop()
    assert len(images) == 2, f"only one replica answered: {sorted(images)}"
    first, second = images.values()
    assert first == second, "the two replicas made different images"

    import sdkit

    pipe = sdkit.load_pipeline(tiny, backend=backend, threads=1)
    try:
        [expected] = pipe.generate("a lighthouse", seed=11, steps=4, sampler="Euler a", guidance_scale=6.0)
    finally:
        pipe.close()
    served = Image.open(io.BytesIO(base64.b64decode(first)))
    assert np.array_equal(np.asarray(served), np.asarray(expected))
