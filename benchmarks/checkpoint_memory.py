"""Peak RSS while loading a single-file checkpoint, against the file's size (issue 14: <= 1.5x).

    python benchmarks/checkpoint_memory.py --make /tmp/sd15_random_fp16.safetensors [--dtype fp16|bf16|fp32]
    python benchmarks/checkpoint_memory.py /tmp/sd15_random_fp16.safetensors [--graphs DIR]

``--make`` writes a full-size random checkpoint of a built-in family (default SD 1.x) in the
LDM/SGM layout a civitai file has: every key and shape of the family's shipped graphs through the
runtime key map, inverted (OpenCLIP's fused q/k/v, 1x1-conv VAE attention), plus CLIP's
``position_ids`` and the DDPM buffers, written tensor by tensor (never all in memory).

Measuring runs each stage in a fresh process and reads its high-water mark (``VmHWM``; the
imports alone are the baseline):

- ``load``: what ``sdkit.load_pipeline`` does before compiling: open, detect the family, map
  and check every key, then read every tensor converted to fp32 one at a time (every value
  summed), as a backend's compile consumes a lazy ``WeightSet`` (each array dropped before the
  next is read; an fp32 tensor is a view of the map, whose pages then count as resident);
- ``naive`` (for comparison): ``safetensors.numpy.load_file`` of the whole file, then each
  tensor converted to fp32 (bf16 files cannot be read this way: numpy has no bf16).

``--graphs DIR`` reads the shipped graphs from another folder (while the full-size UNet graphs are
being exported on another branch).
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

CHILD = r"""
import json, os, sys, time
def high_water_mb():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec (the parent's size at fork).
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
mode, path, graphs = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy as np
import sdkit
from sdkit.families import builtin, load_checkpoint, shipped
if graphs:
    shipped.graphs_dir = lambda: __import__("pathlib").Path(graphs)
baseline = high_water_mb()
start = time.perf_counter()
checked = 0
if mode == "load":
    mapped = load_checkpoint(path, builtin.FAMILIES)
    mapped_s = time.perf_counter() - start
    for weights in mapped.weights.values():
        for name in weights:
            array = weights[name]
            checked += int(array.size) + 0 * int(array.sum(dtype=np.float64))  # every byte read
            del array
else:
    from safetensors.numpy import load_file
    arrays = load_file(path)
    mapped_s = time.perf_counter() - start
    for key in list(arrays):
        converted = arrays[key].astype(np.float32)
        checked += int(converted.size) + 0 * int(converted.sum(dtype=np.float64))
        del converted
peak = high_water_mb()
print(json.dumps({"baseline_mb": baseline, "peak_mb": peak, "map_s": mapped_s,
                  "total_s": time.perf_counter() - start, "values": checked}))
"""


def ldm_header(family_name: str, dtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (shape, safetensors dtype) of a full-size LDM file of a built-in family."""
    from sdkit.families import builtin
    from sdkit.families.family import initializer_specs

    family = next(f for f in builtin.FAMILIES if f.name == family_name)
    stored = {"fp16": "F16", "bf16": "BF16", "fp32": "F32"}[dtype]
    header: dict[str, tuple[tuple[int, ...], str]] = {}
    for component in family.components:
        for name, (shape, _) in initializer_specs(family.components[component].load_graph()).items():
            source = family.key_map_entry(component, "ldm", name, shape)
            target = tuple(shape)
            if source.rows is not None:
                previous = header.get(source.key, ((0, *target[1:]), stored))[0]
                target = (max(previous[0], source.rows[1]), *target[1:])
            if source.transpose:
                target = target[::-1]
            if source.reshape:
                target = (*target, 1, 1)
            header[source.key] = (target, stored)
    header["cond_stage_model.transformer.text_model.embeddings.position_ids"] = ((1, 77), "I64")
    for buffer in ("betas", "alphas_cumprod", "alphas_cumprod_prev"):
        header[buffer] = ((1000,), "F32")
    return header


def make(path: Path, family: str, dtype: str, seed: int = 0) -> None:
    """Write the random file tensor by tensor (header first, then each tensor's bytes)."""
    header = ldm_header(family, dtype)
    itemsize = {"F16": 2, "BF16": 2, "F32": 4, "I64": 8}
    offsets: dict[str, Any] = {}
    position = 0
    for key, (shape, kind) in header.items():
        size = int(np.prod(shape, dtype=np.int64)) * itemsize[kind]
        offsets[key] = {"dtype": kind, "shape": list(shape), "data_offsets": [position, position + size]}
        position += size
    offsets["__metadata__"] = {"format": "pt", "sdkit_benchmark": "random weights"}
    text = json.dumps(offsets).encode()
    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for shape, kind in header.values():
            values = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
            if kind == "F16":
                f.write(values.astype(np.float16).tobytes())
            elif kind == "BF16":
                f.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
            elif kind == "I64":
                f.write(np.arange(values.size, dtype=np.int64).tobytes())
            else:
                f.write(values.tobytes())
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {len(header)} tensors, {dtype})")


def measure(mode: str, path: Path, graphs: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), graphs], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{mode}: failed\n{result.stderr}")
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="the checkpoint to measure")
    parser.add_argument("--make", metavar="FILE", help="write a random full-size checkpoint here first")
    parser.add_argument("--family", default="sd1", help="built-in family for --make (default: %(default)s)")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--seed", type=int, default=0, help="--make: random seed (default: %(default)s)")
    parser.add_argument("--graphs", default="", help="read the shipped graphs from this folder")
    parser.add_argument("--naive", action="store_true", help="also measure safetensors' load_file (fp16/fp32)")
    args = parser.parse_args()
    if args.graphs:
        from sdkit.families import shipped

        shipped.graphs_dir = lambda: Path(args.graphs)  # type: ignore[assignment]
    if args.make:
        make(Path(args.make), args.family, args.dtype, args.seed)
    path = Path(args.file or args.make)
    size_mb = path.stat().st_size / 2**20
    modes = ["load", "naive"] if args.naive else ["load"]
    print(f"{path.name}: {size_mb:,.0f} MiB")
    columns = ("peak RSS", "baseline", "peak/file", "(peak-base)/file", "map s", "total s")
    print(f"{'stage':<6} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, (10, 10, 10, 17, 6, 8), strict=True)))
    for mode in modes:
        r = measure(mode, path, args.graphs)
        ratio, added = r["peak_mb"] / size_mb, (r["peak_mb"] - r["baseline_mb"]) / size_mb
        print(
            f"{mode:<6} {r['peak_mb']:>6,.0f} MiB {r['baseline_mb']:>6,.0f} MiB {ratio:>9.2f}x {added:>16.2f}x "
            f"{r['map_s']:>6.1f} {r['total_s']:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
