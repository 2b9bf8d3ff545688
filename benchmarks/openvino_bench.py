"""sdkit-openvino timings: run time vs onnxruntime (and onnx.reference on the small model),
compile cost cold and from OpenVINO's model cache, and refit cost.

    nice python benchmarks/openvino_bench.py [--repeat 5] [--threads 2] [--reference]

Models: TAEF2 decoder (real weights, latent 1x32x64x64 -> 512x512) and the SD 1.5 VAE decoder
(fixtures/sd_graphs.py, seeded random weights, latent 1x4x32x32 -> 256x256). Medians of
``--repeat`` runs after one warm-up. The machine is shared: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import sdkit
from sdkit.model import Model, load_onnx

REPO = Path(__file__).resolve().parents[1]


def taef2_path() -> Path:
    for folder in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
        if (folder / "taef2_decoder.onnx").exists():
            return folder / "taef2_decoder.onnx"
    raise SystemExit("taef2_decoder.onnx not found (models/taef2 or ../shared/models/taef2)")


def timings(run: object, repeat: int) -> tuple[float, float]:
    """(median, min) seconds of ``repeat`` runs after a warm-up; the min shows what the
    machine does when the other jobs on it are quiet."""
    run()  # type: ignore[operator]  # warm-up (and lazy compile)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def bench_model(label: str, proto: onnx.ModelProto, feeds: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    model = Model.from_proto(proto)
    shapes = {k: v.shape for k, v in feeds.items()}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["SDKIT_CACHE_DIR"] = cache
        start = time.perf_counter()
        compiled = sdkit.compile(model, backend="openvino", input_shapes=shapes, threads=args.threads)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        again = sdkit.compile(model, backend="openvino", input_shapes=shapes, threads=args.threads)
        warm = time.perf_counter() - start
        assert again.info["compiles"][0]["from_cache"], "second compile did not hit the cache"  # type: ignore[attr-defined]
        ours = timings(lambda: compiled.run(feeds), args.repeat)
        out = compiled.run(feeds)
        start = time.perf_counter()
        changed = {k: v * np.float32(1.001) for k, v in model.weights.items() if v.dtype == np.float32 and v.size > 1}
        compiled.refit(model.weights.updated(changed))
        refit = time.perf_counter() - start

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = timings(lambda: session.run(None, feeds), args.repeat)
    want = session.run(None, feeds)[0].astype(np.float64)
    got = next(iter(out.values())).astype(np.float64)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    rows = [("openvino", ours), ("onnxruntime", theirs)]
    if args.reference and label.startswith("TAEF2"):
        reference = sdkit.compile(model, backend="reference")
        rows.append(("reference", timings(lambda: reference.run(feeds), max(1, args.repeat // 5))))
    fastest = min(median for _, (median, _) in rows)
    print(f"\n### {label}\n")
    print("| backend | median s | min s | median / fastest median |\n|---|---|---|---|")
    for name, (median, least) in rows:
        print(f"| {name} | {median:.3f} | {least:.3f} | {median / fastest:.2f} |")
    print(f"\nopenvino vs onnxruntime: max |diff| {np.abs(got - want).max():.2e}, relative L2 {rel:.2e}")
    print(f"compile (convert + compile), cold cache: {cold:.3f} s; second compile from OpenVINO's cache: {warm:.3f} s")
    print(f"refit with new weights (reconvert + recompile one signature): {refit:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference", action="store_true", help="also time onnx.reference on TAEF2 (slow)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import openvino

    print(f"openvino {openvino.get_version()}, onnxruntime {ort.__version__}, ")
    print(f"{args.threads} threads, median of {args.repeat}; shared machine (nice), {os.cpu_count()} cpus")

    taef2 = load_onnx(taef2_path())
    latent = np.random.default_rng(0).standard_normal((1, 32, 64, 64)).astype(np.float32)
    bench_model(
        "TAEF2 decoder, latent 1x32x64x64 -> 512x512", taef2.graph.to_onnx(taef2.weights), {"latent": latent}, args
    )

    sys.path.insert(0, str(REPO / "fixtures"))
    import sd_graphs

    proto = sd_graphs.load_model("sd15_vae_decoder", seed=0)
    bench_model(
        "SD 1.5 VAE decoder, latent 1x4x32x32 -> 256x256", proto, sd_graphs.example_inputs("sd15_vae_decoder"), args
    )


if __name__ == "__main__":
    main()
