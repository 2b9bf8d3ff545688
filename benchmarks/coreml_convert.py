"""sdkit-coreml conversion cost on any OS: ONNX -> .mlpackage time, package size and the ML
program's op histogram for each fixture graph, plus a weight swap (re-conversion).

    nice python benchmarks/coreml_convert.py [--repeat 3] [--precision fp32|fp16] [--target macOS13]

Static shapes (32x32 latents, 256 px images, 77 tokens). Median (min) of ``--repeat``
conversions; the machine is shared, so quote the load average with the numbers. Running the
packages needs macOS (tests/test_macos.py); this measures the converter only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixtures"))
sys.path.insert(0, str(REPO / "packages" / "sdkit-coreml" / "tests"))

import sd_graphs  # noqa: E402
from coreml_helpers import FIXTURES, fixture_model  # noqa: E402

from sdkit_coreml import export_mlpackage  # noqa: E402


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    parser.add_argument("--target", default="macOS13", choices=["macOS13", "macOS14", "macOS15"])
    parser.add_argument("--models", default=",".join(FIXTURES))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; precision {args.precision}, target {args.target}")
    print(f"{'graph':<18} {'convert s, median (min)':>24} {'package MB':>11}  ops")
    for name in args.models.split(","):
        model, feeds = fixture_model(name, sd_graphs, REPO / "models" / "taef2")
        shapes = {k: v.shape for k, v in feeds.items()}
        seconds = []
        with tempfile.TemporaryDirectory() as scratch:
            for i in range(args.repeat):
                path = Path(scratch) / f"{i}.mlpackage"
                start = time.perf_counter()
                info = export_mlpackage(model, path, input_shapes=shapes, precision=args.precision, target=args.target)
                seconds.append(time.perf_counter() - start)
            size = folder_mb(path)
            swapped = model.with_weights({k: v * 0.5 for k, v in model.weights.items() if v.dtype.kind == "f"})
            start = time.perf_counter()
            export_mlpackage(swapped, Path(scratch) / "swap.mlpackage", input_shapes=shapes, precision=args.precision)
            swap = time.perf_counter() - start
        ops = ", ".join(f"{k} {v}" for k, v in sorted(info["ops"].items(), key=lambda kv: -kv[1]) if k != "const")
        timing = f"{statistics.median(seconds):.1f} ({min(seconds):.1f})"
        print(f"{name:<18} {timing:>24} {size:>11.2f}  {ops}; weight swap {swap:.1f} s")


if __name__ == "__main__":
    main()
