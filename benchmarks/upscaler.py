"""Model upscalers on sdkit's backends vs onnxruntime, and the seams of tiling, on the shipped
full-size graphs with seeded random weights (``fixtures/upscalers/make_goldens.py``'s and
``make_swinir_goldens.py``'s values).

    python benchmarks/upscaler.py [--configs x4plus,general,swinir_l,swinir_m] [--size 64] [--repeat 3] [--threads 2]

Per configuration: onnxruntime (peer; the graph filled with the weights) and each available
sdkit backend run the same [1, 3, size, size] image: compile+first-run seconds, median of
``--repeat`` runs after that, ratio to onnxruntime, max |diff| vs onnxruntime (unclamped). Then
the seams: ``ModelUpscaler`` tiled at ``--tile``/``--overlap`` on a ``2.5 x tile`` image vs the
whole image on the fastest backend (max and mean |diff| of the clamped outputs, and the max within
8 output pixels of a tile border, where the seams are).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {
    "x4plus": "full_x4plus",
    "anime6b": "full_x4plus_anime_6b",
    "x2plus": "full_x2plus",
    "general": "full_general_x4v3",
    "animevideo": "full_animevideov3",
    "swinir_l": "full_swinir_l_x4",  # A1111's "SwinIR 4x"
    "swinir_m": "full_swinir_m_classical_x4",
}


def case_file(case: str, folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "packages" / "sdkit-core" / "tests" / "pipelines"))
    if "swinir" in case:
        from test_swinir_upscaler import write_case as write_swinir  # make_swinir_goldens.py's values

        return write_swinir(case, folder)
    from test_upscaler import write_case  # the seeded values the spandrel goldens use

    return write_case(case, folder)


def timed(run: Any, feeds: Any, repeat: int) -> tuple[float, float, Any]:
    start = time.perf_counter()
    out = run(feeds)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = run(feeds)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), out


def peer(graph: Any, weights: Any, threads: int) -> Any:
    import onnxruntime as ort
    from onnx import numpy_helper

    proto = type(graph.proto)()
    proto.CopyFrom(graph.proto)
    del proto.graph.initializer[:]
    for name in weights:
        proto.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weights[name]), name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(["upscaled"], feeds)[0]


def compare(case: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    import sdkit
    from sdkit.families.upscalers import UpscalerFile, find_graph
    from sdkit.model import Model

    path = case_file(case, folder)
    file = UpscalerFile(path)
    graph = find_graph(file.config)
    weights = file.weights(graph)
    side = args.size - args.size % file.config.multiple_of
    image = np.random.default_rng(0).random((1, 3, side, side), dtype=np.float32)
    feeds = {"image": image}
    start = time.perf_counter()
    first, median, want = timed(peer(graph, weights, args.threads), feeds, args.repeat)
    rows = [{"engine": "onnxruntime", "compile_s": first, "median_s": median, "ratio": 1.0, "max_diff": 0.0}]
    base = median
    for backend in ("ggml", "openvino"):
        info = next((b for b in sdkit.backends() if b.name == backend), None)
        if info is None or not info.available:
            continue
        start = time.perf_counter()
        compiled = sdkit.compile(Model(graph, weights), backend=backend, threads=args.threads)
        compile_s = time.perf_counter() - start
        first, median, got = timed(lambda f, c=compiled: c.run(f)["upscaled"], feeds, args.repeat)
        diff = float(np.abs(got - want).max())
        rows.append(
            {
                "engine": backend,
                "compile_s": compile_s + first,
                "median_s": median,
                "ratio": median / base,
                "max_diff": diff,
            }
        )
    return {"case": case, "config": file.config.describe(), "image": [side, side], "rows": rows, "path": str(path)}


def seams(path: str, backend: str, args: argparse.Namespace) -> dict[str, float]:
    from sdkit.pipelines.stages.upscaler import ModelUpscaler

    whole_up = ModelUpscaler(path, backend, tile=0, threads=args.threads)
    tiled_up = ModelUpscaler(path, backend, tile=args.tile, overlap=args.overlap, threads=args.threads)
    side = int(args.tile * 2.5) // 8 * 8
    image = np.random.default_rng(1).random((1, side, side, 3), dtype=np.float32)
    whole, tiled = whole_up.upscale_array(image), tiled_up.upscale_array(image)
    diff = np.abs(whole - tiled)
    from sdkit.pipelines.stages.tiling import tile_starts

    starts = tile_starts(side, args.tile, args.overlap, whole_up.config.multiple_of)
    s = whole_up.scale
    edges = sorted({e * s for t in starts for e in (t, min(t + args.tile, side)) if 0 < e < side})
    near = np.zeros(diff.shape[1], bool)
    for edge in edges:
        near[max(0, edge - 8) : edge + 8] = True
    border = float(max(diff[:, near].max(), diff[:, :, near].max()))
    return {
        "image": side,
        "tiles": len(starts) ** 2,
        "max": float(diff.max()),
        "mean": float(diff.mean()),
        "near_borders_max": border,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="x4plus,general")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--overlap", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from machine import describe, headline

    info = describe()
    print(headline(info))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            result = compare(CONFIGS[name], Path(tmp), args)
            print(f"\n{result['config']}, image {result['image']}:")
            for row in result["rows"]:
                print(
                    f"  {row['engine']:12s} compile+first {row['compile_s']:6.2f} s  median {row['median_s']:7.3f} s  "
                    f"{row['ratio']:5.2f}x  max|diff| {row['max_diff']:.1e}"
                )
            fastest = min(result["rows"][1:], key=lambda r: r["median_s"], default=None)
            if fastest is not None:
                result["seams"] = seams(result["path"], fastest["engine"], args)
                print(f"  tiles {args.tile}/{args.overlap} on {fastest['engine']}: {result['seams']}")
            results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
