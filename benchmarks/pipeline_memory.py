"""Peak memory of a Stable Diffusion pipeline under the ``keep`` and ``offload`` policies.

    python benchmarks/pipeline_memory.py [--model DIR] [--backend reference] [--size 32] [--steps 2]

Each policy runs in a fresh subprocess (peak RSS is a per-process high-water mark): load the
pipeline, generate one image, report the peak RSS (``ru_maxrss``) and the RSS right after the
imports (the interpreter + numpy + onnx baseline), the RSS after the image is made (what stays
resident between images), and the wall time. ``--model`` defaults to the
committed tiny pipeline; a bigger random one can be made with
``fixtures/tiny_pipeline/make_tiny_pipeline.py --medium DIR``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, os, resource, sys, time
import numpy as np, onnx, sdkit
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, backend, policy, size, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
start = time.perf_counter()
pipe = sdkit.load_pipeline(model, backend=backend, memory=policy)
loaded = time.perf_counter()
pipe.generate("a photo of a cat", seed=1, width=size, height=size, steps=steps, sampler="euler", output_type="np")
done = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
resident = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
print(json.dumps({"baseline_mb": baseline / 1024, "peak_mb": peak / 1024, "resident_mb": resident,
                  "load_s": loaded - start, "generate_s": done - loaded, "backends": pipe.backends()}))
"""


def measure(model: str, backend: str, policy: str, size: int, steps: int) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, model, backend, policy, str(size), str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{policy}: failed\n{result.stderr}")
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "fixtures" / "tiny_pipeline" / "model"))
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    weights_mb = sum(p.stat().st_size for p in Path(args.model).rglob("*.onnx*")) / 1e6
    print(
        f"model {args.model} ({weights_mb:.1f} MB of ONNX files), backend {args.backend}, "
        f"{args.size}px, {args.steps} steps"
    )
    header = ["policy", "baseline MB", "peak RSS MB", "peak-baseline", "RSS after", "load s", "generate s"]
    print(f"{header[0]:8} " + " ".join(f"{h:>13}" for h in header[1:]))
    for policy in ("keep", "offload"):
        r = measure(args.model, args.backend, policy, args.size, args.steps)
        keys = ["baseline_mb", "peak_mb", "resident_mb", "load_s", "generate_s"]
        base, peak, resident, load_s, generate_s = (float(r[k]) for k in keys)  # type: ignore[arg-type]
        values = [base, peak, peak - base, resident, load_s, generate_s]
        print(f"{policy:8} " + " ".join(f"{v:13.2f}" for v in values))


if __name__ == "__main__":
    main()
