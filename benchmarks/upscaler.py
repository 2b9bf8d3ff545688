"""Model upscalers on sdkit's backends vs onnxruntime, and the seams of tiling, on the shipped
full-size graphs with seeded random weights (``fixtures/upscalers/make_goldens.py``'s and
``make_swinir_goldens.py``'s values).

    python benchmarks/upscaler.py [--configs x4plus,general,swinir_l,swinir_m] [--size 64] [--repeat 3] [--threads 2]
        [--ggml-variants default,SDKIT_GGML_PASSES_OFF=conv_concat] [--cpu-time] [--profile] [--no-seams]

Per configuration: onnxruntime (peer; the graph filled with the weights) and each available
sdkit backend run the same [1, 3, size, size] image: compile+first-run seconds, median of
``--repeat`` runs after one warm-up (the engines take turns in each round), ratio to
onnxruntime, max |diff| vs onnxruntime (unclamped). ``--ggml-variants``: ggml compiled once per
environment (``KEY=VALUE`` joined by ``+``; e.g. a graph pass off, another conv strategy), each
its own row. ``--cpu-time`` times the process's CPU seconds instead of wall time: with
``--threads 1`` on a shared machine, what each engine computed, not what others ran meanwhile.
``--profile``: ggml's seconds per op kind (CPU seconds at one thread). ``--device cuda:0``: the
ggml rows on that device (openvino left out; onnxruntime, on the CPU, stays the reference for
the outputs, so compare the ggml variants with each other there). Then
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


def clock(cpu: bool) -> Any:
    """Wall time, or with ``--cpu-time`` this process's CPU time (one thread: the time the engine
    computed, whatever else the shared machine runs)."""
    return time.process_time if cpu else time.perf_counter


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


def variant_env(variant: str) -> dict[str, str]:
    """The settings of a ggml variant: ``default``, or ``KEY=VALUE`` pairs joined by ``+``:
    upper-case keys are environment variables (``SDKIT_GGML_PASSES_OFF=conv_concat``,
    ``SDKIT_GGML_CONV=direct``), lower-case ones compile options (``precision=fp16``)."""
    if variant == "default":
        return {}
    return dict(part.split("=", 1) for part in variant.split("+"))


def engines(graph: Any, weights: Any, args: argparse.Namespace) -> dict[str, tuple[Any, float]]:
    """Each engine's run function and compile seconds: onnxruntime, each ggml variant, openvino."""
    import os

    import sdkit
    from sdkit.model import Model

    runs: dict[str, tuple[Any, float]] = {"onnxruntime": (peer(graph, weights, args.threads), 0.0)}
    available = {b.name for b in sdkit.backends() if b.available}
    for variant in args.ggml_variants.split(",") if "ggml" in available else []:
        settings = variant_env(variant)
        env = {k: v for k, v in settings.items() if k.isupper()}
        options = {k: v for k, v in settings.items() if not k.isupper()}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read at compile: the passes and the conv strategy
        try:
            start = time.perf_counter()
            if args.device:
                options["device"] = args.device
            compiled = sdkit.compile(Model(graph, weights), backend="ggml", threads=args.threads, **options)
            runs["ggml" if variant == "default" else f"ggml {variant}"] = (
                lambda f, c=compiled: c.run(f)["upscaled"],
                time.perf_counter() - start,
            )
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    if "openvino" in available and not args.device:
        start = time.perf_counter()
        compiled = sdkit.compile(Model(graph, weights), backend="openvino", threads=args.threads)
        runs["openvino"] = (lambda f, c=compiled: c.run(f)["upscaled"], time.perf_counter() - start)
    return runs


def compare(case: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every engine on one image: one warm-up run each, then ``--repeat`` rounds in which each
    engine runs once (in turn, so a change in the machine's load reaches them all)."""
    from sdkit.families.upscalers import UpscalerFile, find_graph

    path = case_file(case, folder)
    file = UpscalerFile(path)
    graph = find_graph(file.config)
    weights = file.weights(graph)
    side = args.size - args.size % file.config.multiple_of
    feeds = {"image": np.random.default_rng(0).random((1, 3, side, side), dtype=np.float32)}
    runs = engines(graph, weights, args)
    outputs, times = {}, {name: [] for name in runs}
    first = {}
    now = clock(args.cpu_time)
    for name, (run, _) in runs.items():
        start = time.perf_counter()
        outputs[name] = run(feeds)
        first[name] = time.perf_counter() - start
    for _ in range(args.repeat):
        for name, (run, _) in runs.items():
            start = now()
            run(feeds)
            times[name].append(now() - start)
    base = statistics.median(times["onnxruntime"])
    want = outputs["onnxruntime"]
    rows = []
    for name, (_, compile_s) in runs.items():
        median = statistics.median(times[name])
        rows.append(
            {
                "engine": name,
                "compile_s": compile_s + first[name],
                "median_s": median,
                "ratio": median / base,
                "max_diff": float(np.abs(outputs[name] - want).max()),
            }
        )
    result = {"case": case, "config": file.config.describe(), "image": [side, side], "rows": rows, "path": str(path)}
    if args.profile:
        result["profile"] = profile(graph, weights, feeds, args)
    return result


def profile(graph: Any, weights: Any, feeds: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """ggml's time per op kind (``sdkit_ggml.runtime.profile``; at one thread the CPU time of
    each node, which ggml computes on this thread)."""
    import types

    import sdkit
    import sdkit_ggml.runtime.profile as ggml_profile
    from sdkit.model import Model

    if args.threads == 1:
        ggml_profile.time = types.SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[assignment]
    compiled = sdkit.compile(Model(graph, weights), backend="ggml", threads=args.threads)
    compiled.run(feeds)
    result = ggml_profile.profile_program(compiled.program_for(feeds), feeds, args.threads, repeat=2)
    print(result.table(10))
    return [vars(k) for k in result.by_kind()]


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
    parser.add_argument("--ggml-variants", default="default", help="comma-separated: default, KEY=VALUE[+KEY=VALUE]")
    parser.add_argument("--cpu-time", action="store_true", help="time CPU seconds (meant for --threads 1)")
    parser.add_argument("--profile", action="store_true", help="also print ggml's time per op kind")
    parser.add_argument("--no-seams", action="store_true")
    parser.add_argument("--device", default=None, help="ggml's device (cuda:0); onnxruntime stays on the CPU")
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
                    f"  {row['engine']:28s} compile+first {row['compile_s']:6.2f} s  median {row['median_s']:7.3f} s  "
                    f"{row['ratio']:5.2f}x  max|diff| {row['max_diff']:.1e}"
                )
            fastest = min(result["rows"][1:], key=lambda r: r["median_s"], default=None)
            if fastest is not None and not args.no_seams:
                result["seams"] = seams(result["path"], fastest["engine"], args)
                print(f"  tiles {args.tile}/{args.overlap} on {fastest['engine']}: {result['seams']}")
            results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
