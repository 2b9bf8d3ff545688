"""sdkit-openvino against raw OpenVINO, one factor at a time, each variant in its own process.

    python benchmarks/openvino_overhead.py [--cases vae256,taef2] [--rounds 4] [--runs 5] [--threads 2]

Variants:

- ``raw``: ``Core.read_model(file)``, reshape to static shapes, ``compile_model(model, "CPU",
  {"INFERENCE_NUM_THREADS": n})``, ``InferRequest.infer`` + copy of the outputs;
- ``raw+hints``: the same with sdkit's properties (PERFORMANCE_HINT=LATENCY,
  INFERENCE_PRECISION_HINT=f32);
- ``sdkit-convert``: sdkit-openvino's conversion (the weightless graph with in-memory
  external-data references to the WeightSet's arrays, read from bytes), sdkit's properties,
  a plain InferRequest;
- ``sdkit``: ``sdkit.compile(..., backend="openvino").run`` (everything, copies included).

Why one process per variant: two OpenVINO compiled models alternating in one process do not
run alike. On this 2-core machine the same file compiled twice with the same properties
measured 1.08-1.15x slower for the second-compiled copy (median of interleaved runs, both run
orders), and a model run right after another model's run is slower than the one that opens a
round: same-process A/B numbers carry a 10-20% bias of their own, as large as the overhead
looked for. Here every (round, variant) is a fresh process, the variant order rotated each
round, and each variant's ratio to ``raw`` is the median over rounds of (its median / raw's
median in the same round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
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


def variant_runner(name: str, path: Path, feeds: dict[str, np.ndarray], threads: int) -> Callable[[], Any]:
    """The runner for one variant (one compiled model per process)."""
    import openvino as ov

    core = ov.Core()
    static = {key: ov.PartialShape(list(v.shape)) for key, v in feeds.items()}
    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
    if name in ("raw", "raw+hints"):
        model = core.read_model(str(path))
        model.reshape(static)
        return infer_runner(
            core.compile_model(model, "CPU", {**props, **(SDKIT_PROPS if name != "raw" else {})}), feeds
        )
    if name == "sdkit-convert":
        from sdkit.model import load_onnx
        from sdkit_openvino.convert import memory_onnx

        sdkit_model = load_onnx(path)
        data, keepalive = memory_onnx(sdkit_model.graph, sdkit_model.weights)
        converted = core.read_model(data, b"")  # what sdkit_openvino.convert does, minus its checks
        converted.reshape(static)
        run = infer_runner(core.compile_model(converted, "CPU", {**props, **SDKIT_PROPS}), feeds)
        return lambda: (keepalive, run())[1]
    import sdkit

    ours = sdkit.compile(path, backend="openvino", input_shapes={k: v.shape for k, v in feeds.items()},
                         threads=threads, precision="fp32", cache=False)  # fmt: skip
    return lambda: ours.run(feeds)


def child(variant: str, case_name: str, runs: int, threads: int) -> None:
    case = cases.CASES[case_name]
    feeds = cases.feeds(case)
    run = variant_runner(variant, cases.model_path(case), feeds, threads)
    run()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(json.dumps({"variant": variant, "times": times}))


def measure(case_name: str, args: argparse.Namespace) -> None:
    names = ["raw", "raw+hints", "sdkit-convert", "sdkit"]
    medians: dict[str, list[float]] = {n: [] for n in names}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            command = [sys.executable, __file__, "--child", name, "--cases", case_name, "--runs", str(args.runs),
                       "--threads", str(args.threads)]  # fmt: skip
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if not lines:
                raise SystemExit(f"{name} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            medians[name].append(statistics.median(json.loads(lines[-1])["times"]))
    case = cases.CASES[case_name]
    print(f"\n## {case.title}: {args.threads} threads, {args.rounds} rounds x {args.runs} runs, "
          f"load {machine.load_average()}\n")  # fmt: skip
    print(f"{'variant':<14} {'median s':>9} {'min of medians':>15} {'x raw (median of per-round ratios)':>36}")
    for name, values in medians.items():
        ratio = statistics.median(v / r for v, r in zip(values, medians["raw"], strict=True))
        print(f"{name:<14} {statistics.median(values):9.3f} {min(values):15.3f} {ratio:36.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="vae256,taef2")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.cases, args.runs, args.threads)
        return 0
    import openvino

    print(f"# sdkit-openvino vs raw OpenVINO {openvino.get_version()}: {machine.headline(machine.describe())}")
    for name in args.cases.split(","):
        measure(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
