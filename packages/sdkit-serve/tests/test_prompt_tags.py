"""A1111's extra-network tags found in linear time (issue 30 item 1): the scanner finds exactly
what A1111's regular expression finds, and the input that froze the server for 21-28 s is fast."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from sdkit.errors import InputError
from sdkit_serve.a1111 import Txt2ImgRequest, plan_generation
from sdkit_serve.config import Limits
from sdkit_serve.prompt_tags import find_tags, remove_tags

A1111_PATTERN = re.compile(r"<(\w+):([^>]+)>")  # what A1111 (and this server before) matched with


def test_the_scanner_finds_what_the_regular_expression_finds() -> None:
    rng = random.Random(0)
    alphabet = "<>:a_b1 é\n"
    samples = ["", "<lora:a:1>", "<<a:b>", "<a:>", "<a:<b>", "a <lora:x:0.5> b <hyp_1:y:z:w> <:x>", "<é:x>"]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    for text in samples:
        tags = find_tags(text)
        assert [(t.kind, t.body) for t in tags] == A1111_PATTERN.findall(text), text
        assert remove_tags(text, tags) == A1111_PATTERN.sub("", text), text


@pytest.mark.parametrize("prompt", ["<a:" * 20000, "<lora:" * 20000, "<a:" + "b" * 60000, "<a:b>" * 12000])
def test_adversarial_prompts_parse_in_linear_time(prompt: str) -> None:
    """'<a:' * 20000 took A1111's pattern 21-28 s on this server's event loop. The bound is a
    generous one (a complexity check, not a benchmark): linear work is milliseconds."""
    limits = Limits(max_prompt_chars=len(prompt))
    plan_generation(Txt2ImgRequest(prompt="warm up the sampler registry", steps=1), limits)
    start = time.perf_counter()
    plan_generation(Txt2ImgRequest(prompt=prompt, negative_prompt=prompt, steps=1), limits)
    assert time.perf_counter() - start < 1.0


def test_prompt_length_is_bounded() -> None:
    with pytest.raises(
        InputError,
        match=r"prompt is 20001 characters, over this server's limit of 20000 \(sdkit serve --max-prompt-chars\)",
    ):
        plan_generation(Txt2ImgRequest(prompt="a" * 20001), Limits())
    with pytest.raises(InputError, match="negative_prompt is 11 characters"):
        plan_generation(Txt2ImgRequest(negative_prompt="a" * 11), Limits(max_prompt_chars=10))


def test_planning_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """While a request is being planned (prompt parsing, folders, ControlNet images), the server
    still answers ``/progress``: planning runs in a worker thread, not on the event loop."""
    import asyncio

    import httpx

    from sdkit_serve import a1111
    from sdkit_serve.app import create_app
    from sdkit_serve.config import ServerConfig
    from sdkit_serve.engine import Engine

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)  # a plan that takes long, as '<a:' * 20000 did with A1111's pattern
        raise InputError("planned")

    monkeypatch.setattr(a1111, "plan_generation", slow_plan)
    engine = Engine(ServerConfig(models=(tmp_path,)))  # not started: no model is loaded

    async def run() -> tuple[float, int]:
        transport = httpx.ASGITransport(app=create_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            planning = asyncio.ensure_future(client.post("/sdapi/v1/txt2img", json={"prompt": "x"}))
            await asyncio.sleep(0.3)
            start = time.perf_counter()
            progress = await client.get("/sdapi/v1/progress")
            answered = time.perf_counter() - start
            assert progress.status_code == 200 and not planning.done()
            return answered, (await planning).status_code

    try:
        answered, status = asyncio.run(run())
    finally:
        engine.close()
    assert status == 400 and answered < 1.0, f"/progress took {answered:.2f} s while a request was planned"
