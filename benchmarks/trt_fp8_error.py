"""The error of sdkit-trt's ``precision="fp8"`` graph against float32 on FLUX.1-dev's transformer
at full width (2 double + 2 single blocks, 1.03B seeded random weights), without a GPU.

    taskset -c 0 nice python benchmarks/trt_fp8_error.py [--threads 1] [--fp16]

The graph ``precision="fp8"`` hands TensorRT (``sdkit_trt.fp8``: fp16 activations, FP8 E4M3
linear weights behind DequantizeLinear) is plain ONNX, so onnxruntime CPU runs it. Each run is
a fresh subprocess (peak RSS is per process): float32 reference from
``sd_graphs.model_path("flux_transformer_2x2")`` (4.1 GB of external data in
``fixtures/cache/``, written once, tensor by tensor), then the fp8 graph (its weights quantized
tensor by tensor from the memory-mapped float32 ones, written as external data to a temporary
folder), then with ``--fp16`` the fp16 graph for comparison. Inputs: the 512 px ones of
``benchmarks/flux_transformer.py`` (1024 image + 512 text tokens, timestep 1, guidance 3.5).
onnxruntime runs without weight prepacking, so a run's peak stays near its weights' size
(4.9 GB for float32, 2.6 GB for fp8, 5.3 GB for fp16 with the memory-mapped float32
file pages counted). Prints rel-L2 and max |diff| of one transformer call.

Random weights are not a trained checkpoint: their channels have no outliers, which FP8's
per-channel scaling handles better than it would real ones. The number bounds nothing on a GPU:
TensorRT's kernels are not run here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "fixtures" / "cache"

CHILD = r"""
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
import numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[1])
import sd_graphs
from sdkit.model import load_onnx
kind, threads, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
path = sd_graphs.model_path("flux_transformer_2x2")
feeds = sd_graphs.example_inputs("flux_transformer_2x2")
start = time.perf_counter()
folder = None
info = {}
if kind != "fp32":
    from sdkit_trt.fp8 import convert_graph_fp8
    from sdkit_trt.fp16 import convert_graph
    from sdkit_trt.onnx_source import write_external
    model = load_onnx(path)  # external data memory-mapped, read per tensor
    plan = convert_graph_fp8(model.graph) if kind == "fp8" else convert_graph(model.graph)
    if kind == "fp8":
        info["quantized"] = len(plan.quantized)
        info["quantized_params"] = sum(int(np.prod(model.weights.spec(n)[0])) for n in plan.quantized)
        info["params"] = sum(int(np.prod(model.weights.spec(n)[0])) for n in model.weights)
    weights = plan.convert_weights(model.weights)
    info["engine_weights_mb"] = sum(np.asarray(weights[n]).nbytes for n in weights) / 2**20
    folder = Path(tempfile.mkdtemp(prefix="sdkit-fp8-", dir=sys.argv[5]))
    path = write_external(plan.graph, weights, folder)
    del model, plan, weights
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.add_session_config_entry("session.disable_prepacking", "1")  # no second copy of the weights
session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
info["prepare_s"] = time.perf_counter() - start
start = time.perf_counter()
result = session.run(["out_hidden_states"], feeds)[0]
info["run_s"] = time.perf_counter() - start
info["peak_rss_mb"] = peak_mb()
np.save(out, result)
if folder is not None:
    shutil.rmtree(folder, ignore_errors=True)
print(json.dumps(info))
"""


def run(kind: str, threads: int) -> tuple[np.ndarray | None, dict[str, object]]:
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"flux_2x2_trt_{kind}.npy"
    out.unlink(missing_ok=True)
    args = [sys.executable, "-c", CHILD, str(ROOT / "fixtures"), kind, str(threads), str(out), str(CACHE)]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode:
        return None, {"error": result.stderr.strip().splitlines()[-3:]}
    info: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return np.load(out), info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fp16", action="store_true", help="also run the fp16 graph (its error for comparison)")
    args = parser.parse_args()
    started = time.perf_counter()
    reference, info = run("fp32", args.threads)
    print("fp32:", json.dumps(info), flush=True)
    if reference is None:
        return 1
    for kind in ["fp8", *(["fp16"] if args.fp16 else [])]:
        got, info = run(kind, args.threads)
        if got is not None:
            info["rel_l2"] = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
            info["max_abs_diff"] = float(np.abs(got - reference).max())
            info["max_abs_ref"] = float(np.abs(reference).max())
            info["finite"] = bool(np.isfinite(got).all())
        print(f"{kind}:", json.dumps(info), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
