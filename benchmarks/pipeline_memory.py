"""Peak memory of a pipeline (Stable Diffusion or flow: SD3/Flux/Chroma) under the ``keep`` and
``offload`` policies.

    python benchmarks/pipeline_memory.py [--model DIR] [--backend reference] [--size 32] [--steps 2]
        [--width W --height H] [--max-sequence-length L] [--threads N]

Each policy runs in a fresh subprocess (peak RSS is a per-process high-water mark): load the
pipeline, generate one image, report the peak RSS (``ru_maxrss``) and the RSS right after the
imports (the interpreter + numpy + onnx baseline), the RSS after the image is made (what stays
resident between images), the wall time, and the max |diff| between the two policies' images.
``--model`` defaults to the committed tiny pipeline; a bigger random one can be made with
``fixtures/tiny_pipeline/make_tiny_pipeline.py --medium DIR``, a medium Flux one (static
32 x 48 px transformer, 32 T5 tokens: ``--width 48 --height 32 --max-sequence-length 32``) with
``fixtures/tiny_flow/make_medium_flux.py DIR``.
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
CHILD = r"""
import json, os, resource, sys, time
import numpy as np, onnx, sdkit
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, backend, policy, steps, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
extra = json.loads(sys.argv[6])
options = {"threads": extra.pop("threads")} if extra.get("threads") else {}
start = time.perf_counter()
pipe = sdkit.load_pipeline(model, backend=backend, memory=policy, **options)
loaded = time.perf_counter()
image = pipe.generate("a photo of a cat", seed=1, steps=steps, sampler="euler", output_type="np", **extra)
done = time.perf_counter()
np.save(out, image)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
resident = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
print(json.dumps({"baseline_mb": baseline / 1024, "peak_mb": peak / 1024, "resident_mb": resident,
                  "load_s": loaded - start, "generate_s": done - loaded, "backends": pipe.backends()}))
"""


def measure(model: str, backend: str, policy: str, steps: int, out: Path, extra: dict[str, int]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, model, backend, policy, str(steps), str(out), json.dumps(extra)],
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
    parser.add_argument("--width", type=int, default=None, help="default: --size")
    parser.add_argument("--height", type=int, default=None, help="default: --size")
    parser.add_argument("--max-sequence-length", type=int, default=None, help="T5 tokens (flow pipelines)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    extra = {"width": args.width or args.size, "height": args.height or args.size}
    if args.max_sequence_length:
        extra["max_sequence_length"] = args.max_sequence_length
    if args.threads:
        extra["threads"] = args.threads
    weights_mb = sum(p.stat().st_size for p in Path(args.model).rglob("*.onnx*")) / 1e6
    print(
        f"model {args.model} ({weights_mb:.1f} MB of ONNX files), backend {args.backend}, "
        f"{extra['width']}x{extra['height']} px, {args.steps} steps"
    )
    header = ["policy", "baseline MB", "peak RSS MB", "peak-baseline", "RSS after", "load s", "generate s"]
    print(f"{header[0]:8} " + " ".join(f"{h:>13}" for h in header[1:]))
    images = []
    for policy in ("keep", "offload"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "image.npy"
            r = measure(args.model, args.backend, policy, args.steps, out, extra)
            images.append(np.load(out))
        keys = ["baseline_mb", "peak_mb", "resident_mb", "load_s", "generate_s"]
        base, peak, resident, load_s, generate_s = (float(r[k]) for k in keys)  # type: ignore[arg-type]
        values = [base, peak, peak - base, resident, load_s, generate_s]
        print(f"{policy:8} " + " ".join(f"{v:13.2f}" for v in values))
    diff = float(np.abs(images[0] - images[1]).max())
    print(f"backends {r['backends']}; max |diff| keep vs offload image: {diff:.3g}")


if __name__ == "__main__":
    main()
