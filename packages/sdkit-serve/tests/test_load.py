"""50 concurrent requests against a queue of 8: each gets an image or a 429 with Retry-After, the
server stays up, and its memory comes back to where it was."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import Counter
from typing import Any

import httpx
from serve_helpers import ServerProcess

REQUEST = {"prompt": "a crowd", "steps": 4, "seed": 3, "sampler_name": "Euler", "width": 64, "height": 64}
CONCURRENT = 50


async def hammer(server: ServerProcess) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=CONCURRENT + 5, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600, limits=limits) as client:
        return await asyncio.gather(*(client.post("/sdapi/v1/txt2img", json=REQUEST) for _ in range(CONCURRENT)))


def test_fifty_concurrent_requests_against_a_queue_of_eight(server: ServerProcess) -> None:
    with server.client() as client:
        for _ in range(2):  # warm: compiled shapes, arenas, PNG encoder
            assert client.post("/sdapi/v1/txt2img", json=REQUEST).status_code == 200
        expected = client.post("/sdapi/v1/txt2img", json=REQUEST).json()["images"]
    before = server.rss_bytes()
    start = time.monotonic()
    responses = asyncio.run(hammer(server))
    elapsed = time.monotonic() - start
    counts = Counter(r.status_code for r in responses)
    assert set(counts) <= {200, 429}, f"only images or 429s: {counts}"
    served: list[dict[str, Any]] = [r.json() for r in responses if r.status_code == 200]
    assert len(served) >= 9, "the running job and the 8 queued ones must be served"
    for body in served:
        assert body["images"] == expected and base64.b64decode(body["images"][0])[:8] == b"\x89PNG\r\n\x1a\n"
        assert json.loads(body["info"])["all_seeds"] == [3]
    for refused in (r for r in responses if r.status_code == 429):
        assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["error"] == "QueueFull"
    with server.client() as client:
        assert client.get("/sdapi/v1/options").status_code == 200  # still alive
        assert client.get("/sdapi/v1/progress").json()["state"]["queue_pending"] == 0
    after = server.rss_bytes()
    print(
        f"50 concurrent, queue 8: {counts[200]} images, {counts[429]} x 429 in {elapsed:.1f} s; "
        f"RSS {before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB after ({(after - before) / before:+.1%})"
    )
    assert abs(after - before) <= 0.10 * before
