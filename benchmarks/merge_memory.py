"""Peak RSS of ``sdkit merge`` (streamed tensor by tensor) against the files' sizes.

    python benchmarks/merge_memory.py [--mb 256] [--tensors 64] [--dir /tmp]

Writes two random fp16 "checkpoints" (``model.diffusion_model.<i>.weight``, equal tensors; never
all in memory), then in fresh processes measures the high-water mark (``VmHWM``, the imports
alone are the baseline) of:

- ``sdkit``: ``sdkit.families.merge.merge_checkpoints`` weighted sum, fp16 output;
- ``naive``: ``safetensors.numpy.load_file`` of both, the same sum in float32, ``save_file``
  (what a whole-dict merger such as A1111's holds).
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import sys, time
def high_water_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
mode, a, b, out = sys.argv[1:5]
import numpy as np
from safetensors.numpy import load_file, save_file
from sdkit.families.merge import merge_checkpoints
baseline = high_water_mb()
start = time.perf_counter()
if mode == "sdkit":
    merge_checkpoints(a, b, output=out, alpha=0.3)
else:
    x, y = load_file(a), load_file(b)
    save_file({k: (x[k].astype(np.float32) * 0.7 + y[k].astype(np.float32) * 0.3).astype(np.float16) for k in x}, out)
peak, seconds = high_water_mb() - baseline, time.perf_counter() - start
print(f"{mode}: peak {peak:.0f} MB over the imports' {baseline:.0f} MB, {seconds:.1f} s")
"""


def write_random(path: Path, tensors: int, elements: int, seed: int) -> None:
    shape = [elements // 1024, 1024]
    size = elements * 2
    header = {
        f"model.diffusion_model.{i}.weight": {
            "dtype": "F16",
            "shape": shape,
            "data_offsets": [i * size, (i + 1) * size],
        }
        for i in range(tensors)
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _ in range(tensors):
            f.write(rng.standard_normal(elements, dtype=np.float32).astype(np.float16).tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="size of each input file")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    folder = Path(args.dir)
    elements = args.mb * 1024 * 1024 // 2 // args.tensors // 1024 * 1024
    a, b = folder / "merge_bench_a.safetensors", folder / "merge_bench_b.safetensors"
    write_random(a, args.tensors, elements, 1)
    write_random(b, args.tensors, elements, 2)
    print(f"inputs: 2 x {a.stat().st_size / 1e6:.0f} MB, {args.tensors} tensors of {elements * 2 / 1e6:.1f} MB")
    try:
        for mode in ("sdkit", "naive"):
            out = folder / f"merge_bench_{mode}.safetensors"
            result = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(a), str(b), str(out)],
                capture_output=True,
                text=True,
                check=True,
            )
            print(result.stdout.strip())
            out.unlink(missing_ok=True)
    finally:
        a.unlink(missing_ok=True)
        b.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
