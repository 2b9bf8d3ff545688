"""sdkit-ggml's first call per input shape: where its time goes, and a whole first generate().

    python benchmarks/ggml_first_call.py [--models clip,unet,vae] [--compute-latent 8] [--threads 1]
                                         [--device cpu] [--profile] [--tiny-runs 3] [--out first_call.json]

Part 1, full size: the shipped weightless SD 1.5 graphs (``sdkit.families.shipped``: ``clip_l``,
``sd1_unet``, ``vae_decoder``) filled with random weights (views of one shared random pool: no
checkpoint, little memory), compiled with ``GgmlBackend`` on the CPU. Per model, at the shapes a
512 px txt2img with CFG runs (CLIP input ids 2x77, UNet batch 2 at a 64x64 latent, VAE decoder
1x4x64x64): ``compile`` (graph passes, weight reads), then the first ``program_for`` (a build
without computing), split by ``GgmlCompiledModel.builds`` into ``lower`` (ONNX nodes to ggml
tensors, constant folding included), ``graph`` (ggml graph and the device's op check), ``weights``
(weight buffer and upload) and ``allocate`` (gallocr), and a second ``program_for`` with the same
shapes (a lookup: no build). ``--profile`` prints cProfile's top functions of each build. The
first compute of a full-size UNet or VAE takes minutes on a 2-core CPU, so compute is measured
at ``--compute-latent`` (a second signature: its build is logged too): first run against the
median of the next ones; CLIP computes at full size.

Part 2, a whole pipeline: ``fixtures/tiny_pipeline/model`` on ggml, ``--tiny-runs`` generate()
calls (64 px, 20 steps, CFG), the first against the later ones, and the builds per component;
then a second load whose components are built at load (``GgmlCompiledModel.prepare`` with the
shapes the first run used), the same generate() calls after it.

``--threads 1`` by default: on a shared CPU, ggml's spinning worker threads slow each other
down far more than they help (the tiny pipeline: 4.3 s per image at 1 thread, 15-24 s at 2).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import machine  # noqa: E402

TINY_PIPELINE = ROOT.parent / "fixtures" / "tiny_pipeline" / "model"
GRAPHS = {"clip": "clip_l", "unet": "sd1_unet", "vae": "vae_decoder"}
POOL_ELEMENTS = 40_000_000  # more than the largest SD 1.5 weight (CLIP's 49408x768 embedding)


def random_weights(graph: Any) -> Any:
    """Every initializer as a view of one random pool (floats) or zeros (integers)."""
    from sdkit.model import WeightSet

    pool = np.random.default_rng(0).standard_normal(POOL_ELEMENTS).astype(np.float32) * 0.02
    arrays = {}
    for init in graph.proto.graph.initializer:
        shape = tuple(int(d) for d in init.dims)
        size = int(np.prod(shape, dtype=np.int64))
        arrays[init.name] = pool[:size].reshape(shape) if init.data_type == 1 else np.zeros(shape, np.int64)
    return WeightSet(arrays)


def feeds_for(model: str, latent: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    if model == "clip":
        return {"input_ids": np.tile(np.arange(77, dtype=np.int64), (2, 1))}
    if model == "unet":
        return {
            "sample": rng.standard_normal((2, 4, latent, latent)).astype(np.float32),
            "timestep": np.array([999.0, 999.0], np.float32),
            "encoder_hidden_states": rng.standard_normal((2, 77, 768)).astype(np.float32),
        }
    return {"latent_sample": rng.standard_normal((1, 4, latent, latent)).astype(np.float32)}


def profiled(work: Any, enabled: bool) -> tuple[Any, str]:
    if not enabled:
        return work(), ""
    profile = cProfile.Profile()
    result = profile.runcall(work)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
    return result, text.getvalue()


def last_build(compiled: Any) -> dict[str, float]:
    builds = getattr(compiled, "builds", None)  # absent before this benchmark's commit
    return dict(builds[-1].seconds) if builds else {}


def full_size(model: str, args: argparse.Namespace) -> dict[str, Any]:
    from sdkit.device import Device
    from sdkit.families.shipped import load_graph
    from sdkit.options import make_options
    from sdkit_ggml.backend import GgmlBackend

    graph = load_graph(GRAPHS[model])
    weights = random_weights(graph)
    backend = GgmlBackend()
    options = make_options({"precision": args.precision, "threads": args.threads}, backend.extra_options)
    start = time.perf_counter()
    device = next(d for d in backend.devices() if d == Device.parse(args.device))
    compiled = backend.compile(graph, weights, device, options)
    row: dict[str, Any] = {"model": GRAPHS[model], "compile_s": time.perf_counter() - start}
    feeds = feeds_for(model, 64)
    start = time.perf_counter()
    program, row["profile"] = profiled(lambda: compiled.program_for(feeds), args.profile)
    row["first_build_s"] = time.perf_counter() - start
    row["stages_s"] = last_build(compiled)
    row["nodes"] = program.nodes
    row["weights_mb"], row["compute_mb"] = (b / 2**20 for b in program.memory())
    start = time.perf_counter()
    compiled.program_for(feeds)
    row["same_shape_again_s"] = time.perf_counter() - start
    row["builds_after_same_shape"] = len(getattr(compiled, "builds", []))
    small = feeds if model == "clip" else feeds_for(model, args.compute_latent)
    start = time.perf_counter()
    compiled.run(small)
    row["compute_shape"] = {k: list(v.shape) for k, v in small.items()}
    row["first_run_s"] = time.perf_counter() - start  # a build of its own where the shape is new
    row["first_run_stages_s"] = last_build(compiled) if model != "clip" else {}
    later = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        compiled.run(small)
        later.append(time.perf_counter() - start)
    row["later_run_median_s"] = statistics.median(later)
    row["builds"] = len(getattr(compiled, "builds", []))
    compiled.close()
    return row


def generate_times(pipe: Any, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        pipe.generate(prompt="a photo of a cat", width=64, height=64, steps=20, seed=1)
        times.append(time.perf_counter() - start)
    return times


def tiny_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """As a user runs it, then again with every component's graph built at load by
    ``GgmlCompiledModel.prepare`` for the shapes the first run used (what a pipeline could do
    for its default size)."""
    from sdkit.pipelines.loaders.loading import load_pipeline

    start = time.perf_counter()
    pipe = load_pipeline(TINY_PIPELINE, backend="ggml", device=args.device, threads=args.threads)
    row: dict[str, Any] = {"load_s": time.perf_counter() - start, "generate_s": generate_times(pipe, args.tiny_runs)}
    row["builds"], shapes = {}, {}
    for name, component in pipe.components.items():
        compiled = component.compiled
        if compiled is not None and hasattr(compiled, "builds"):
            row["builds"][name] = [{"seconds": b.seconds, "nodes": b.nodes} for b in compiled.builds]
            shapes[name] = {n: shape for n, shape, _ in compiled.signatures[0]}
    pipe.close()
    if shapes:
        start = time.perf_counter()
        pipe = load_pipeline(TINY_PIPELINE, backend="ggml", device=args.device, threads=args.threads)
        for name, input_shapes in shapes.items():
            compiled = pipe.components[name].compiled
            if hasattr(compiled, "prepare"):
                compiled.prepare(input_shapes)
        row["prepared_load_s"] = time.perf_counter() - start
        row["prepared_generate_s"] = generate_times(pipe, args.tiny_runs)
        pipe.close()
    return row


def show(rows: list[dict[str, Any]], tiny: dict[str, Any] | None) -> None:
    for row in rows:
        stages = " ".join(f"{k} {v:.2f}" for k, v in row["stages_s"].items())
        print(f"{row['model']:12s} compile {row['compile_s']:.2f} s | first build {row['first_build_s']:.2f} s "
              f"({stages}) | same shape again {row['same_shape_again_s'] * 1e3:.2f} ms | {row['nodes']} nodes, "
              f"weights {row['weights_mb']:.0f} MB, compute {row['compute_mb']:.0f} MB")  # fmt: skip
        print(f"{'':12s} compute at {row['compute_shape']}: first {row['first_run_s']:.3f} s, "
              f"later median {row['later_run_median_s']:.3f} s; builds {row['builds']}")  # fmt: skip
        if row["profile"]:
            print(row["profile"])
    if tiny:
        runs = tiny["generate_s"]
        later = statistics.median(runs[1:]) if len(runs) > 1 else float("nan")
        print(f"tiny pipeline: load {tiny['load_s']:.2f} s, first generate {runs[0]:.2f} s, later median "
              f"{later:.2f} s (first - later {runs[0] - later:.2f} s)")  # fmt: skip
        if "prepared_generate_s" in tiny:
            runs = tiny["prepared_generate_s"]
            later = statistics.median(runs[1:]) if len(runs) > 1 else float("nan")
            print(f"  built at load (prepare): load {tiny['prepared_load_s']:.2f} s, first generate {runs[0]:.2f} s, "
                  f"later median {later:.2f} s (first - later {runs[0] - later:.2f} s)")  # fmt: skip
        for name, builds in tiny["builds"].items():
            stages = [{k: round(v, 3) for k, v in b["seconds"].items()} for b in builds]
            print(f"  {name}: {len(builds)} build(s) {stages}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="clip,unet,vae")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu", help="a ggml device: cpu, cuda:0...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compute-latent", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tiny-runs", type=int, default=3, help="0: skip the pipeline")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model, simd = machine.cpuinfo()
    print(f"CPU: {model} ({', '.join(simd)}), load average {machine.load_average()}")
    rows = [full_size(m, args) for m in args.models.split(",") if m]
    tiny = tiny_pipeline(args) if args.tiny_runs else None
    show(rows, tiny)
    if args.out:
        report = {"cpu": model, "load_average": machine.load_average(), "full_size": rows, "tiny_pipeline": tiny}
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
