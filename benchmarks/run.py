"""Speed and memory of sdkit backends against their peers, measured in the same run.

    python benchmarks/run.py taef2_decoder --runners ggml,openvino,onnxruntime --repeat 5
    python benchmarks/run.py sd15_vae_decoder --shape latent_sample=1x4x64x64

Each (runner, model) pair runs in its own process, so peak RSS is that runner's alone.
Runners: any sdkit backend name, plus ``onnxruntime`` (the peer, run directly through its
own API, not through sdkit). Prints median/min seconds, the ratio to onnxruntime and to the
fastest, peak RSS, and max |diff| against onnxruntime's outputs. The machine is noisy: quote
medians and ratios, not absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("worker.py")

# name -> (how to find it, default input shapes)
MODELS: dict[str, dict[str, tuple[int, ...]]] = {
    "taef2_decoder": {"latent": (1, 32, 64, 64)},
    "taef2_encoder": {"image": (1, 3, 512, 512)},
    "sd15_vae_decoder": {"latent_sample": (1, 4, 32, 32)},
    "sd15_vae_encoder": {"sample": (1, 3, 256, 256)},
    "tiny_unet": {},
    "tiny_clip_text": {},
    "sd15_unet": {},
}


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, _, text = item.partition("=")
        shapes[name] = tuple(int(d) for d in text.split("x"))
    return shapes


def run_worker(
    runner: str, model: str, shapes: dict[str, tuple[int, ...]], args: argparse.Namespace, out: Path
) -> dict:
    command = [
        sys.executable,
        str(WORKER),
        "--runner", runner,
        "--model", model,
        "--shapes", json.dumps({k: list(v) for k, v in shapes.items()}),
        "--repeat", str(args.repeat),
        "--warmup", str(args.warmup),
        "--threads", str(args.threads),
        "--precision", args.precision,
        "--outputs", str(out),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"runner": runner, "error": tail[0][:160]}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--runners", default="ggml,openvino,onnxruntime")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=AxBxC")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    shapes = {**MODELS[args.model], **parse_shapes(args.shape)}
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    if "onnxruntime" not in runners:
        runners.append("onnxruntime")  # the peer every ratio is taken against
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for runner in runners:
            out = Path(tmp) / f"{runner}.npz"
            result = run_worker(runner, args.model, shapes, args, out)
            result["_out"] = out
            results.append(result)
            print(f"  {runner}: {result.get('median_s', result.get('error'))}", file=sys.stderr)
        peer = next(r for r in results if r["runner"] == "onnxruntime")
        peer_out = dict(np.load(peer["_out"])) if "error" not in peer else None
        for r in results:
            if "error" in r or peer_out is None:
                continue
            mine = dict(np.load(r["_out"]))
            r["max_diff"] = max(float(np.max(np.abs(mine[k].astype(np.float64) - peer_out[k]))) for k in peer_out)
    print_table(args, shapes, results)
    return 0


def print_table(args: argparse.Namespace, shapes: dict[str, tuple[int, ...]], results: list[dict]) -> None:
    timed = [r for r in results if "error" not in r]
    fastest = min((r["median_s"] for r in timed), default=float("nan"))
    peer = next((r["median_s"] for r in timed if r["runner"] == "onnxruntime"), float("nan"))
    shape_text = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
    print(f"{args.model} ({shape_text}), {args.threads} threads, {args.precision}, median of {args.repeat}")
    header = (
        "runner",
        "compile s",
        "median s",
        "min s",
        "x onnxruntime",
        "x fastest",
        "peak RSS MB",
        "max|diff| vs ort",
    )
    rows = [header]
    for r in results:
        if "error" in r:
            rows.append((r["runner"], "-", "-", "-", "-", "-", "-", "error: " + r["error"]))
            continue
        rows.append(
            (
                r["runner"],
                f"{r['compile_s']:.2f}",
                f"{r['median_s']:.4f}",
                f"{r['min_s']:.4f}",
                f"{r['median_s'] / peer:.2f}",
                f"{r['median_s'] / fastest:.2f}",
                f"{r['peak_rss_mb']:.0f}",
                f"{r.get('max_diff', float('nan')):.2e}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))


if __name__ == "__main__":
    sys.exit(main())
