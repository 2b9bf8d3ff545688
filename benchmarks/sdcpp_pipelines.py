"""Whole pipelines side by side: stable-diffusion.cpp (sdkit-sdcpp) and sdkit's own pipelines on
its graph backends, on the same single-file checkpoint, size, sampler, steps and CFG.

    python benchmarks/sdcpp_pipelines.py [--model FILE] [--engines sdcpp,ggml,openvino]
        [--size 256] [--steps 4] [--repeat 3] [--threads 2]

``--engines`` may name ``auto`` too: ``load_pipeline(model)`` as a user gets it, which after
``sdkit tune MODEL`` is the engine measured faster per whole image (the "ran on" column says which).
``--model`` defaults to a full-size SD 1.5 file of random fp16 weights
(``random_checkpoint.py sd1``, written once into the sdkit cache). Each engine runs in a process of
its own (``load_pipeline(model, backend=ENGINE)``; peak RSS is that engine's alone): load (sd.cpp
reads its files, sdkit compiles its components), one untimed generation (sdkit's first run per
shape compiles), then ``--repeat`` timed generations of one image (txt2img, Euler, cfg 7, seed 1).
Printed: load seconds, the first generation, median and min of the timed ones, the ratio to the
fastest median, peak RSS; with the CPU, its SIMD flags, the load average before and after, and the
versions. Images are not compared: each engine draws its own noise (sd.cpp's is not sdkit's), so
same-weights equality is not expected; sdkit-sdcpp's tests check sd.cpp through sdkit against the
binding itself. Results as JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
CHILD = r"""
import json, resource, sys, time
import sdkit
model, engine, size, steps, repeat, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
start = time.perf_counter()
pipe = sdkit.load_pipeline(model, backend=engine, threads=threads)
loaded = time.perf_counter() - start

def once():
    begin = time.perf_counter()
    pipe.generate("a photo of a cat", seed=1, steps=steps, width=size, height=size, sampler="euler",
                  guidance_scale=7.0, output_type="np")
    return time.perf_counter() - begin

first = once()
runs = [once() for _ in range(repeat)]
print(json.dumps({"load_s": loaded, "first_s": first, "runs_s": runs, "backends": pipe.backends(),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def default_model() -> Path:
    sys.path.insert(0, str(ROOT))
    import random_checkpoint

    from sdkit.cache import cache_root

    name = f"sd15-random-{random_checkpoint.FORMAT}.safetensors"
    return random_checkpoint.write("sd1", cache_root() / "benchmarks" / name)


def measure(model: Path, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-c", CHILD, str(model), engine, str(args.size), str(args.steps)]
    command += [str(args.repeat), str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"engine": engine, "error": (done.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["engine"] = engine
    result["median_s"] = statistics.median(result["runs_s"])
    result["min_s"] = min(result["runs_s"])
    return result


def report(results: list[dict[str, Any]]) -> None:
    ok = [r for r in results if "error" not in r]
    fastest = min((r["median_s"] for r in ok), default=0.0)
    print("| engine | load s | first s | median s | min s | x fastest | peak RSS MB | ran on |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['engine']} | failed: {r['error']} |")
            continue
        ran = ", ".join(sorted({str(b) for b in r["backends"].values() if b}))
        print(
            f"| {r['engine']} | {r['load_s']:.1f} | {r['first_s']:.2f} | {r['median_s']:.2f} | {r['min_s']:.2f} "
            f"| {r['median_s'] / fastest:.2f} | {r['peak_rss_mb']:.0f} | {ran} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--engines", default="sdcpp,ggml,openvino")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import machine

    model = args.model or default_model()
    about = machine.describe()
    print(f"# {model.name}, {args.size}x{args.size}, {args.steps} Euler steps, cfg 7, {args.threads} threads")
    print(f"# {machine.headline(about)}")
    results = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        results.append(measure(model, engine, args))
    report(results)
    print(f"# load average after {machine.load_average()}; versions {about.get('versions')}")
    out = ROOT / "results" / f"sdcpp-pipelines-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": about, "args": vars(args) | {"model": str(model)}, "results": results}))
    print(f"# written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
