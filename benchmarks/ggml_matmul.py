"""ggml's matrix product on this CPU against numpy's BLAS: GFLOP/s, f32 and f16 weights.

    python benchmarks/ggml_matmul.py [--threads 2] [--repeat 5]
    SDKIT_GGML_LIB_DIR=/path/to/build/lib python benchmarks/ggml_matmul.py   # another ggml build
    python benchmarks/ggml_matmul.py --upscaler --threads 1 --cpu-time   # ESRGAN's shapes, the lowering's order

The shapes are those of the SD 1.5 VAE decoder's convolutions after im2col (ggml's CPU conv is
im2col + mul_mat): ``M`` output channels, ``K`` = in-channels x 3 x 3, ``N`` output pixels.
ggml computes ``mul_mat(W, X)`` with W [M, K] (f32 or f16) and X [N, K] f32, as sdkit-ggml's
Conv lowering did for the VAE; numpy computes ``X @ W.T`` in f32 through its BLAS (OpenBLAS in the PyPI
wheels). Prints the ggml CPU backend's compiled-in features (llamafile sgemm, OpenMP, ISA).
``--upscaler``: the 3x3 convs of ESRGAN's dense blocks on a 64x64 map (N = 4096 pixels; K = 576
for 64 channels, 288 for a 32-channel part, 1728 for the whole concat of conv5), timed as
``mul_mat(X, W)`` (the im2col rows first: the order the Conv lowering uses).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from sdkit_ggml.runtime.buildinfo import backend_features
from sdkit_ggml.runtime.lib import GGML_TYPE_F16, GGML_TYPE_F32, InitParams, load_library

CLOCK = [time.perf_counter]  # --cpu-time: time.process_time
SHAPES = ((512, 4608, 1024), (256, 2304, 4096), (128, 1152, 16384))  # (M, K, N)
UPSCALER_SHAPES = ((64, 576, 4096), (32, 288, 4096), (32, 576, 4096), (64, 1728, 4096))


def ggml_rate(lib, backend: int, m: int, k: int, n: int, wtype: int, threads: int, repeat: int,  # type: ignore[no-untyped-def]
              cols_first: bool = False) -> float:  # fmt: skip
    ctx = lib.ggml_init(
        InitParams(lib.ggml_tensor_overhead() * 16 + lib.ggml_graph_overhead_custom(16, False), None, True)
    )
    w = lib.ggml_new_tensor_4d(ctx, wtype, k, m, 1, 1)
    x = lib.ggml_new_tensor_4d(ctx, GGML_TYPE_F32, k, n, 1, 1)
    y = lib.ggml_mul_mat(ctx, x, w) if cols_first else lib.ggml_mul_mat(ctx, w, x)
    graph = lib.ggml_new_graph_custom(ctx, 16, False)
    lib.ggml_build_forward_expand(graph, y)
    buffer = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((m, k)).astype(np.float16 if wtype == GGML_TYPE_F16 else np.float32)
    inputs = rng.standard_normal((n, k)).astype(np.float32)
    lib.ggml_backend_tensor_set(w, weights.ctypes.data, 0, weights.nbytes)
    lib.ggml_backend_tensor_set(x, inputs.ctypes.data, 0, inputs.nbytes)
    lib.ggml_backend_cpu_set_n_threads(backend, threads)
    lib.ggml_backend_graph_compute(backend, graph)  # warm-up
    times = []
    for _ in range(repeat):
        start = CLOCK[0]()
        lib.ggml_backend_graph_compute(backend, graph)
        times.append(CLOCK[0]() - start)
    out = np.empty((m, n) if cols_first else (n, m), dtype=np.float32)
    lib.ggml_backend_tensor_get(y, out.ctypes.data, 0, out.nbytes)
    out = out.T if cols_first else out
    want = inputs[:64] @ weights.astype(np.float32).T
    err = float(np.abs(out[:64] - want).max() / np.abs(want).max())
    lib.ggml_backend_buffer_free(buffer)
    lib.ggml_free(ctx)
    if err > 1e-2:
        raise SystemExit(f"ggml mul_mat result is wrong (relative error {err:.1e})")
    return 2.0 * m * n * k / min(times) / 1e9  # best run: the least disturbed on a shared machine


def numpy_rate(m: int, k: int, n: int, repeat: int) -> float:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x @ w.T
    times = []
    for _ in range(repeat):
        start = CLOCK[0]()
        x @ w.T
        times.append(CLOCK[0]() - start)
    return 2.0 * m * n * k / min(times) / 1e9  # best run: the least disturbed on a shared machine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="time only the first N shapes")
    parser.add_argument("--upscaler", action="store_true", help="ESRGAN's conv shapes, im2col rows first")
    parser.add_argument("--cpu-time", action="store_true", help="CPU seconds of this process (for --threads 1)")
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK[0] = time.process_time
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    lib = load_library()
    cpu = next(
        i for i in range(lib.ggml_backend_dev_count()) if lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i)) == 0
    )
    backend = lib.ggml_backend_dev_init(lib.ggml_backend_dev_get(cpu), None)
    features = backend_features(lib)
    rows = []
    for m, k, n in UPSCALER_SHAPES if args.upscaler else SHAPES[: args.shapes]:
        first = args.upscaler
        rows.append({
            "shape": f"M={m} K={k} N={n}",
            "ggml_f32": ggml_rate(lib, backend, m, k, n, GGML_TYPE_F32, args.threads, args.repeat, first),
            # the lowering's order takes F32 second operands only (ggml's CPU asserts it)
            "ggml_f16": 0.0 if first else ggml_rate(lib, backend, m, k, n, GGML_TYPE_F16, args.threads, args.repeat),
            "numpy_f32": numpy_rate(m, k, n, args.repeat),
        })  # fmt: skip
    lib.ggml_backend_free(backend)
    if args.json:
        print(json.dumps({"library_dir": str(lib.directory), "features": features, "rows": rows,
                          "load": os.getloadavg()}))  # fmt: skip
        return 0
    print(f"ggml {lib.version} from {lib.directory}: {', '.join(f'{k}={v}' for k, v in features.items())}")
    print(f"{args.threads} threads, best of {args.repeat}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':<24} {'ggml f32':>9} {'ggml f16':>9} {'numpy f32':>10}  GFLOP/s")
    for r in rows:
        print(f"{r['shape']:<24} {r['ggml_f32']:9.1f} {r['ggml_f16']:9.1f} {r['numpy_f32']:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
