"""sdkit-openvino against raw OpenVINO in one process, one factor at a time, runs interleaved.

    python benchmarks/openvino_overhead.py [--cases vae256,taef2] [--rounds 7] [--threads 2]

Variants, each compiled once, then timed round-robin (one run of each per round, so the shared
machine's load falls on all of them alike):

- ``raw``: ``Core.read_model(file)``, reshape to static shapes, ``compile_model(model, "CPU",
  {"INFERENCE_NUM_THREADS": n})``, ``InferRequest.infer`` + copy of the outputs;
- ``raw+hints``: the same with sdkit's properties (PERFORMANCE_HINT=LATENCY,
  INFERENCE_PRECISION_HINT=f32);
- ``sdkit-convert``: sdkit-openvino's conversion (the weightless graph with in-memory
  external-data references to the WeightSet's arrays, read from bytes), sdkit's properties,
  a plain InferRequest;
- ``sdkit``: ``sdkit.compile(..., backend="openvino").run`` (everything, copies included).

Prints median and min per variant and each one's ratio to ``raw`` (median of per-round ratios,
which cancels load that changes between rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases
import machine

SDKIT_PROPS = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}


def infer_runner(compiled: Any, feeds: dict[str, np.ndarray]) -> Callable[[], list[np.ndarray]]:
    request = compiled.create_infer_request()

    def run() -> list[np.ndarray]:
        request.infer(feeds)
        return [np.array(request.get_output_tensor(i).data, copy=True) for i in range(len(compiled.outputs))]

    return run


def variants(path: Path, feeds: dict[str, np.ndarray], threads: int) -> dict[str, Callable[[], Any]]:
    import openvino as ov

    import sdkit
    from sdkit.model import load_onnx
    from sdkit_openvino.convert import memory_onnx

    core = ov.Core()
    static = {name: ov.PartialShape(list(v.shape)) for name, v in feeds.items()}

    def raw(props: dict[str, Any]) -> Any:
        model = core.read_model(str(path))
        model.reshape(static)
        return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, **props})

    sdkit_model = load_onnx(path)
    data, keepalive = memory_onnx(sdkit_model.graph, sdkit_model.weights)
    converted = core.read_model(data, b"")  # what sdkit_openvino.convert does, minus its checks
    converted.reshape(static)
    ours = sdkit.compile(path, backend="openvino", input_shapes={k: v.shape for k, v in feeds.items()},
                         threads=threads, precision="fp32", cache=False)  # fmt: skip
    return {
        "raw": infer_runner(raw({}), feeds),
        "raw+hints": infer_runner(raw(SDKIT_PROPS), feeds),
        "sdkit-convert": infer_runner(
            core.compile_model(converted, "CPU", {"INFERENCE_NUM_THREADS": threads, **SDKIT_PROPS}), feeds
        ),
        "sdkit": lambda: (keepalive, ours.run(feeds))[1],
    }


def measure(case_name: str, rounds: int, threads: int) -> None:
    case = cases.CASES[case_name]
    feeds = cases.feeds(case)
    runners = variants(cases.model_path(case), feeds, threads)
    for run in runners.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    print(f"\n## {case.title}: {threads} threads, {rounds} interleaved rounds, load {machine.load_average()}\n")
    print(f"{'variant':<14} {'median s':>9} {'min s':>8} {'x raw (median of per-round ratios)':>36}")
    for name, values in times.items():
        ratio = statistics.median(v / r for v, r in zip(values, times["raw"], strict=True))
        print(f"{name:<14} {statistics.median(values):9.3f} {min(values):8.3f} {ratio:36.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="vae256,taef2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import openvino

    print(f"# sdkit-openvino vs raw OpenVINO {openvino.get_version()}: {machine.headline(machine.describe())}")
    for name in args.cases.split(","):
        measure(name, args.rounds, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
