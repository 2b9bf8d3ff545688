"""FLUX.1-dev's transformer at full width: check() of the full-depth graph, one 512 px step of
the reduced-depth one (2 double + 2 single blocks, 1.03B random weights), per backend.

    nice python benchmarks/flux_transformer.py [--backend ggml --backend openvino] [--threads 2]
        [--weights bf16 --weights fp32] [--precision fp32 --precision q8_0]

Graphs: ``fixtures/sd/flux_transformer_2x2.onnx`` (weightless, ``make_sd_graphs.py``) and
``sd_graphs.flux_full_graph()`` (its blocks repeated to 19 + 38, 11.9B weights, weightless:
check() reads no weights). The step runs in a fresh subprocess per backend (peak RSS is a
per-process high-water mark): compile from ``sd_graphs.model_path`` (seeded weights written once to ``fixtures/cache/``,
external data; ``--weights bf16``, the default, stores them as bf16 widened by a Cast to the
fp32 the backends compute in, ``sd_graphs.stored_as``), run the 512 px inputs twice, report
compile time, each run's time, the RSS after loading, after compiling and at its peak, and the
max |diff| and relative L2 between backends' outputs (and between weight dtypes: bf16 rounding of
the weights; and between compute precisions: ``--precision q8_0`` is ggml's Q8_0 weights, the
error vs full precision issue 12 asks to report).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))
import sd_graphs  # noqa: E402  (fixtures is not a package)

CHILD = r"""
import json, resource, sys, time
import numpy as np, sdkit
sys.path.insert(0, sys.argv[4])
import sd_graphs
backend, threads, out, weights, repeats = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5], int(sys.argv[6])
precision = sys.argv[7]
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
path = sd_graphs.model_path("flux_transformer_2x2", weight_dtype=weights)
feeds = sd_graphs.example_inputs("flux_transformer_2x2")
model = sdkit.load_model(path)
loaded, load_peak = rss_mb(), peak_mb()
weight_mb = sum(model.weights[name].nbytes for name in model.weights) / 2**20
start = time.perf_counter()
compiled = sdkit.compile(model, backend=backend, threads=threads, precision=precision, cache=False)
compiled_s = time.perf_counter() - start
del model
after_compile, compile_peak = rss_mb(), peak_mb()
runs = []
for _ in range(repeats):
    t = time.perf_counter()
    result = compiled.run(feeds)["out_hidden_states"]
    runs.append(time.perf_counter() - t)
np.save(out, result)
print(json.dumps({"weights_mb": weight_mb, "loaded_rss_mb": loaded, "load_peak_mb": load_peak,
                  "compile_s": compiled_s, "compiled_rss_mb": after_compile, "compile_peak_mb": compile_peak,
                  "run_s": runs, "run_rss_mb": rss_mb(), "peak_rss_mb": peak_mb(),
                  "finite": bool(np.isfinite(result).all()), "std": float(result.std())}))
"""


def full_graph_check(backend: str) -> dict[str, object]:
    from sdkit.model import Graph
    from sdkit.selection import get_backend

    graph = Graph(sd_graphs.flux_full_graph())
    weights = sum(int(np.prod(t.dims)) for t in graph.proto.graph.initializer)
    report = get_backend(backend).check(graph)
    return {
        "nodes": len(graph.proto.graph.node),
        "weights": weights,
        "ok": report.ok,
        "unsupported": report.unsupported,
    }


def one_step(backend: str, threads: int, out: Path, weights: str, runs: int, precision: str) -> dict[str, object]:
    child = [backend, str(threads), str(out), str(ROOT / "fixtures"), weights, str(runs), precision]
    result = subprocess.run(
        [sys.executable, "-c", CHILD, *child],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        return {"error": result.stderr.strip().splitlines()[-1:]}
    parsed: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def _product(weights: list[str], precisions: list[str]) -> list[tuple[str, str]]:
    return [(w, p) for w in weights for p in precisions]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=None, help="repeatable (default: ggml, openvino)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", action="append", default=None, help="bf16|fp16|fp32, repeatable (default: bf16)")
    parser.add_argument("--precision", action="append", default=None, help="fp32|fp16|q8_0, repeatable (default: fp32)")
    parser.add_argument("--runs", type=int, default=2, help="steps timed per backend (the first warms up)")
    parser.add_argument("--skip-check", action="store_true", help="skip check() of the full-depth graph")
    parser.add_argument("--skip-step", action="store_true", help="only check() the full-depth graph")
    args = parser.parse_args()
    backends = args.backend or ["ggml", "openvino"]
    precisions = args.precision or ["fp32"]
    outputs: dict[tuple[str, str], np.ndarray] = {}
    for backend in backends:
        if not args.skip_check:
            print(backend, "full-depth check():", json.dumps(full_graph_check(backend), default=str), flush=True)
        for weights, precision in [] if args.skip_step else _product(args.weights or ["bf16"], precisions):
            tag = weights if precision == "fp32" else f"{weights}-{precision}"
            out = ROOT / "fixtures" / "cache" / f"flux_2x2_{backend}_{tag}.npy"
            out.unlink(missing_ok=True)
            step = one_step(backend, args.threads, out, weights, args.runs, precision)
            print(backend, f"2x2 one step at 512 px, {weights} weights, {precision}:", json.dumps(step), flush=True)
            if out.exists():
                outputs[backend, tag] = np.load(out)
    for path in sorted((ROOT / "fixtures" / "cache").glob("flux_2x2_*.npy")):
        backend, tag = path.stem.removeprefix("flux_2x2_").split("_", 1)
        if (backend, tag) not in outputs:  # from an earlier invocation
            outputs[backend, tag] = np.load(path)
    keys = sorted(outputs)
    for i, first in enumerate(keys):
        for second in keys[i + 1 :]:
            a, b = outputs[first].astype(np.float64), outputs[second].astype(np.float64)
            diff, rel = float(np.abs(a - b).max()), float(np.linalg.norm(a - b) / np.linalg.norm(a))
            print(f"{first} vs {second}: max |diff| {diff:.3e}, rel-L2 {rel:.3e} (output std {float(a.std()):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
