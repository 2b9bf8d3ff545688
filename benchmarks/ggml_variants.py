"""Compare ggml builds on this machine: mul_mat GFLOP/s and, optionally, a benchmark case.

    python benchmarks/ggml_variants.py pypi native=/tmp/ggml/native/lib avx2-llamafile=/path/lib \
        [--rounds 3] [--threads 1,2] [--case vae256]

``pypi`` is the installed libggml-python; ``NAME=DIR`` any other build's library folder (what
``SDKIT_GGML_LIB_DIR`` takes). Every measurement runs in a process of its own, the variants in
rotation for ``--rounds`` rounds (the machine is shared: rotation spreads the other jobs' load),
and each variant keeps its best GFLOP/s per shape (mul_mat) or its median seconds (``--case``,
through worker.py with sdkit-ggml fp32). How to make such builds: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_json(command: list[str], lib_dir: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("SDKIT_GGML_LIB_DIR", None)
    if lib_dir:
        env["SDKIT_GGML_LIB_DIR"] = lib_dir
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="+", help="'pypi' or NAME=LIBDIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--shapes", type=int, default=3, help="mul_mat shapes to time (ggml_matmul.py --shapes)")
    parser.add_argument("--case", default=None, help="also time this benchmark case (worker.py, ggml-fp32)")
    args = parser.parse_args()
    variants = [(v, None) if v == "pypi" else tuple(v.split("=", 1)) for v in args.variants]
    best: dict[tuple[str, str, str], float] = {}
    case_times: dict[tuple[str, str], list[float]] = {}
    features: dict[str, dict[str, str]] = {}
    for round_index in range(args.rounds):
        shift = round_index % len(variants)
        for name, lib_dir in variants[shift:] + variants[:shift]:
            for threads in args.threads.split(","):
                result = run_json(
                    [
                        sys.executable,
                        str(HERE / "ggml_matmul.py"),
                        "--json",
                        "--threads",
                        threads,
                        "--repeat",
                        "3",
                        "--shapes",
                        str(args.shapes),
                    ],
                    lib_dir,
                )
                if "error" in result:
                    print(f"{name}: {result['error']}", file=sys.stderr)
                    continue
                features[name] = result["features"]
                for row in result["rows"]:
                    for kind in ("ggml_f32", "ggml_f16", "numpy_f32"):
                        key = (name, f"{threads}t {row['shape']}", kind)
                        best[key] = max(best.get(key, 0.0), row[kind])
                if args.case:
                    out = Path("/tmp") / f"ggml-variant-{os.getpid()}.npz"
                    timed = run_json(
                        [sys.executable, str(HERE / "worker.py"), "--engine", "ggml-fp32", "--case", args.case,
                         "--repeat", "3", "--threads", threads, "--outputs", str(out)],
                        lib_dir,
                    )  # fmt: skip
                    if "times" in timed:
                        case_times.setdefault((name, threads), []).extend(timed["times"])
    print(f"# ggml builds, best of {args.rounds} rounds x 3 runs; load average now {os.getloadavg()[0]:.1f}")
    for name, _ in variants:
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in features.get(name, {}).items()))
    shapes = sorted({k[1] for k in best})
    print(f"\n{'shape':<32}" + "".join(f"{n + ' f32':>22}{n + ' f16':>22}" for n, _ in variants) + f"{'numpy f32':>12}")
    for shape in shapes:
        cells = "".join(
            f"{best.get((n, shape, 'ggml_f32'), 0):22.1f}{best.get((n, shape, 'ggml_f16'), 0):22.1f}"
            for n, _ in variants
        )
        numpy_best = max(best.get((n, shape, "numpy_f32"), 0) for n, _ in variants)
        print(f"{shape:<32}{cells}{numpy_best:12.1f}")
    for (name, threads), values in case_times.items():
        print(f"{args.case} ggml-fp32 {name} {threads} threads: median {statistics.median(values):.3f} s, "
              f"min {min(values):.3f} s over {len(values)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
