"""Concurrency stress (issue 15): one compiled TAEF2 decoder shared by 8 threads, 50 runs each,
per backend; every output bit-identical to a single-threaded run of the same input. Marked
``stress``: it runs in CI (8x50 runs of a 4x4 latent: well under a minute per backend on 2 idle
cores); ``-m "not stress"`` leaves it out."""

from __future__ import annotations

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.model import Model

THREADS, RUNS = 8, 50
# onnx.reference runs the decoder in seconds, not milliseconds: fewer runs, same threads
RUNS_BY_BACKEND = {"ggml": RUNS, "openvino": RUNS, "reference": 2}
_MODULES = {"ggml": "sdkit_ggml", "openvino": "openvino", "reference": "onnx"}


@pytest.mark.stress
@pytest.mark.parametrize("backend", sorted(RUNS_BY_BACKEND))
def test_threads_share_one_compiled_decoder(backend: str, taef2: Path) -> None:
    if importlib.util.find_spec(_MODULES[backend]) is None:
        pytest.skip(f"{backend} is not installed")
    model = sdkit.load_model(taef2 / "taef2_decoder.onnx")
    assert isinstance(model, Model)
    name, out = model.inputs[0].name, model.outputs[0].name
    rng = np.random.default_rng(15)
    # a different latent per thread: a mix-up between threads cannot go unseen
    latents = [rng.standard_normal((1, 32, 4, 4)).astype(np.float32) for _ in range(THREADS)]
    options = {"threads": 1} if backend != "reference" else {}
    compiled = sdkit.compile(model, backend=backend, **options)
    expected = [compiled.run({name: x})[out] for x in latents]
    runs = RUNS_BY_BACKEND[backend]

    def worker(index: int) -> int:
        mismatches = 0
        for _ in range(runs):
            got = compiled.run({name: latents[index]})[out]
            mismatches += int(not np.array_equal(got, expected[index]))
        return mismatches

    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        mismatches = sum(pool.map(worker, range(THREADS)))
    wall = time.perf_counter() - start
    print(f"{backend}: {THREADS} threads x {runs} runs, {mismatches} mismatches, {wall:.1f} s")
    assert mismatches == 0
