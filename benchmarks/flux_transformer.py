"""FLUX.1-dev's transformer at full width: check() of the full-depth graph, one 512 px step of
the reduced-depth one (2 double + 2 single blocks, 1.2B random weights), per backend.

    nice python benchmarks/flux_transformer.py [--backend ggml --backend openvino] [--threads 2]

Graphs: ``fixtures/sd/flux_transformer_2x2.onnx`` (weightless, ``make_sd_graphs.py``) and
``sd_graphs.flux_full_graph()`` (its blocks repeated to 19 + 38, 11.9B weights, weightless:
check() reads no weights). The step runs in a fresh subprocess per backend (peak RSS is a
per-process high-water mark): compile from ``sd_graphs.model_path`` (seeded fp32 weights
written once to ``fixtures/cache/``, external data), run the 512 px inputs twice, report
compile time, each run's time and the peak RSS, and the max |diff| between backends' outputs.
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
backend, threads, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
path = sd_graphs.model_path("flux_transformer_2x2")
feeds = sd_graphs.example_inputs("flux_transformer_2x2")
start = time.perf_counter()
compiled = sdkit.compile(path, backend=backend, threads=threads, cache=False)
compiled_s = time.perf_counter() - start
runs = []
for _ in range(2):
    t = time.perf_counter()
    result = compiled.run(feeds)["out_hidden_states"]
    runs.append(time.perf_counter() - t)
np.save(out, result)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"compile_s": compiled_s, "run_s": runs, "peak_rss_mb": peak,
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


def one_step(backend: str, threads: int, out: Path) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, backend, str(threads), str(out), str(ROOT / "fixtures")],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        return {"error": result.stderr.strip().splitlines()[-1:]}
    parsed: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=None, help="repeatable (default: ggml, openvino)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-step", action="store_true", help="only check() the full-depth graph")
    args = parser.parse_args()
    backends = args.backend or ["ggml", "openvino"]
    outputs = {}
    for backend in backends:
        print(backend, "full-depth check():", json.dumps(full_graph_check(backend), default=str), flush=True)
        if args.skip_step:
            continue
        out = ROOT / "fixtures" / "cache" / f"flux_2x2_{backend}.npy"
        print(backend, "2x2 one step at 512 px:", json.dumps(one_step(backend, args.threads, out)), flush=True)
        if out.exists():
            outputs[backend] = np.load(out)
    if len(outputs) == 2:
        a, b = outputs.values()
        print("max |diff| between backends:", float(np.abs(a - b).max()), "output std", float(a.std()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
