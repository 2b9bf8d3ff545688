"""sdkit-ggml's conv strategies side by side: F32 im2col + mul_mat versus ggml_conv_2d_direct.

    python benchmarks/ggml_conv.py [--threads 1] [--repeat 3] [--shapes 4]      # per shape
    python benchmarks/ggml_conv.py --case vae256 [--strategies im2col,direct,auto]
    python benchmarks/ggml_conv.py --upscaler --threads 1 --cpu-time   # ESRGAN's convs, and onnxruntime

Per shape: the SD 1.5 VAE decoder's 3x3 convs at 256 px (channels 128..512, maps 32..256),
each a one-Conv model compiled with ``conv=`` forced, the strategies alternated run by run in
one process; median seconds and direct/im2col. ``--case``: worker.py (ggml-fp32) once per
strategy through $SDKIT_GGML_CONV, in rotation for ``--rounds``; ``auto`` gets an empty
artifact cache each time, so its compile time includes the timing (a second compile would
not). ``SDKIT_GGML_LIB_DIR`` picks the ggml build, as everywhere. ``--upscaler``: ESRGAN's 3x3
convs on a 64x64 tile (and its 256x256 upsampled one) instead of the VAE's, with onnxruntime's
time for the same one-Conv model beside them; ``--cpu-time`` times the process's CPU seconds
(with ``--threads 1``: what the engine computed, on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# (input channels, output channels, map size) of the SD 1.5 VAE decoder's 3x3 convs at 256 px
VAE256_SHAPES = [
    (512, 512, 32),
    (512, 512, 64),
    (512, 512, 128),
    (512, 256, 128),
    (256, 256, 128),
    (256, 256, 256),
    (256, 128, 256),
    (128, 128, 256),
    (128, 3, 256),
]
# ESRGAN's RRDB convs at a 64x64 tile (64 features, 32 growth channels), and its upsampled ones
UPSCALER_SHAPES = [(64, 32, 64), (96, 32, 64), (160, 32, 64), (192, 64, 64), (64, 64, 64), (64, 64, 256)]
CLOCK = [time.perf_counter]  # --cpu-time: time.process_time


def onnxruntime_run(model, x: np.ndarray, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    proto = model.graph.to_onnx(model.weights).SerializeToString()
    session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})[0]


def time_shapes(
    shapes: list[tuple[int, int, int]], threads: int, repeat: int, peer: bool = False
) -> list[dict[str, object]]:
    import sdkit
    from sdkit_ggml.compiler.conv_strategy import ConvShape
    from sdkit_ggml.conv_tuning import micro_model

    rows = []
    for c, oc, size in shapes:
        shape = ConvShape((1, c, size, size), (oc, c, 3, 3), (1, 1), (1, 1), (1, 1), 0)
        model, x = micro_model(shape, max_macs=shape.macs)  # the whole map, not a band
        compiled = {s: sdkit.compile(model, backend="ggml", threads=threads, conv=s) for s in ("im2col", "direct")}
        runs = {s: (lambda m=m, x=x: m.run({"x": x})["y"]) for s, m in compiled.items()}
        if peer:
            runs["onnxruntime"] = onnxruntime_run(model, x, threads)
        times: dict[str, list[float]] = {s: [] for s in runs}
        outputs = {s: run() for s, run in runs.items()}  # warm-up
        for _ in range(repeat):
            for strategy, run in runs.items():
                start = CLOCK[0]()
                run()
                times[strategy].append(CLOCK[0]() - start)
        error = float(np.linalg.norm(outputs["direct"] - outputs["im2col"]) / np.linalg.norm(outputs["im2col"]))
        median = {s: statistics.median(t) for s, t in times.items()}
        rows.append({"shape": f"{c}->{oc} 3x3 @{size}", "gmac": shape.macs / 1e9, **median,
                     "direct/im2col": median["direct"] / median["im2col"], "rel_l2": error})  # fmt: skip
        if peer:
            rows[-1]["im2col/onnxruntime"] = median["im2col"] / median["onnxruntime"]
        for m in compiled.values():
            m.close()
    return rows


def time_case(case: str, strategies: list[str], threads: int, rounds: int, repeat: int) -> dict[str, object]:
    results: dict[str, list[dict[str, object]]] = {s: [] for s in strategies}
    for round_index in range(rounds):
        shift = round_index % len(strategies)
        for strategy in strategies[shift:] + strategies[:shift]:
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "SDKIT_GGML_CONV": strategy, "SDKIT_CACHE_DIR": tmp}
                command = [sys.executable, str(HERE / "worker.py"), "--engine", "ggml-fp32", "--case", case,
                           "--threads", str(threads), "--repeat", str(repeat),
                           "--outputs", f"{tmp}/out.npz"]  # fmt: skip
                proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                if proc.returncode or not lines:
                    raise SystemExit(f"{strategy}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
                results[strategy].append(json.loads(lines[-1]))
    summary: dict[str, object] = {}
    for strategy, runs in results.items():
        times = [t for r in runs for t in r["times"]]  # type: ignore[attr-defined]
        summary[strategy] = {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "compile_s": statistics.median([float(r["compile_s"]) for r in runs]),  # type: ignore[arg-type]
            "conv": runs[-1].get("conv"),
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shapes", type=int, default=len(VAE256_SHAPES), help="time only the first N shapes")
    parser.add_argument("--case", default=None, help="time this benchmark case end to end instead")
    parser.add_argument("--strategies", default="im2col,direct,auto")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--upscaler", action="store_true", help="ESRGAN's conv shapes, onnxruntime beside")
    parser.add_argument("--cpu-time", action="store_true", help="CPU seconds of this process (for --threads 1)")
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK[0] = time.process_time
    print(f"ggml library: {os.environ.get('SDKIT_GGML_LIB_DIR') or 'default'}; load {os.getloadavg()}")
    if args.case:
        summary = time_case(args.case, args.strategies.split(","), args.threads, args.rounds, args.repeat)
        print(json.dumps(summary, indent=1))
        return 0
    shapes = UPSCALER_SHAPES if args.upscaler else VAE256_SHAPES[: args.shapes]
    for row in time_shapes(shapes, args.threads, args.repeat, peer=args.upscaler):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
