"""TAEF2 decoder timing: ggml vs onnxruntime vs the reference backend (median of N runs).

python benchmarks/ggml_bench.py [--latent 64] [--repeat 5] [--threads N] [--skip-reference]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def model_dir() -> Path:
    for candidate in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
        if (candidate / "taef2_decoder.onnx").exists():
            return candidate
    raise SystemExit("TAEF2 models not found")


def timed(fn, repeat: int) -> tuple[float, np.ndarray]:  # type: ignore[no-untyped-def]
    out = fn()  # warm-up (and, for ggml, the per-signature graph build)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latent", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    import onnxruntime as ort

    import sdkit
    from sdkit.model import load_onnx
    from sdkit.options import physical_cores

    threads = args.threads or physical_cores()
    path = model_dir() / "taef2_decoder.onnx"
    model = load_onnx(path)
    name = model.inputs[0].name
    latent = np.random.default_rng(0).standard_normal((1, 32, args.latent, args.latent), dtype=np.float32)
    rows = []
    compiled = sdkit.compile(model, backend="ggml", threads=threads)
    t_ggml, out_ggml = timed(
        lambda: (
            compiled.run({name: latent})["image"]
            if "image" in [o.name for o in model.outputs]
            else next(iter(compiled.run({name: latent}).values()))
        ),
        args.repeat,
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    t_ort, out_ort = timed(lambda: session.run(None, {name: latent})[0], args.repeat)
    rows.append(("ggml", t_ggml, float(np.abs(out_ggml - out_ort).max())))
    rows.append(("onnxruntime", t_ort, 0.0))
    if not args.skip_reference:
        reference = sdkit.compile(model, backend="reference")
        t_ref, out_ref = timed(lambda: next(iter(reference.run({name: latent}).values())), 1)
        rows.append(("reference", t_ref, float(np.abs(out_ref - out_ort).max())))
    print(f"TAEF2 decoder, latent 1x32x{args.latent}x{args.latent}, {threads} threads, median of {args.repeat}")
    print(f"{'backend':<12} {'seconds':>9} {'vs ort':>7} {'max|diff| vs ort':>17}")
    for backend, seconds, diff in rows:
        print(f"{backend:<12} {seconds:9.3f} {seconds / t_ort:7.2f} {diff:17.2e}")


if __name__ == "__main__":
    main()
