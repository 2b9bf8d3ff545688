"""One benchmark measurement in a process of its own (see run.py): prints one JSON line."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def model_path(name: str) -> Path:
    taef2 = ROOT / "models" / "taef2" / f"{name}.onnx"
    if taef2.is_file():
        return taef2
    sys.path.insert(0, str(ROOT))
    from fixtures import sd_graphs  # the SD architecture graphs with seeded random weights

    return Path(sd_graphs.model_path(name))


def example_feeds(name: str, path: Path, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    import onnx

    rng = np.random.default_rng(0)
    if not shapes and not (ROOT / "models" / "taef2" / f"{name}.onnx").is_file():
        sys.path.insert(0, str(ROOT))
        from fixtures import sd_graphs

        return dict(sd_graphs.example_inputs(name))
    graph = onnx.load(str(path), load_external_data=False).graph
    feeds = {}
    for vi in graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = shapes[vi.name]
        feeds[vi.name] = (
            rng.standard_normal(shape).astype(dtype)
            if np.issubdtype(dtype, np.floating)
            else rng.integers(0, 10, shape).astype(dtype)
        )
    if name == "taef2_encoder":
        feeds = {k: (v * 0.25 + 0.5).clip(0, 1).astype(np.float32) for k, v in feeds.items()}
    return feeds


def compile_runner(runner: str, path: Path, feeds: dict[str, np.ndarray], threads: int, precision: str):
    if runner == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return lambda: dict(zip(names, session.run(None, feeds), strict=True))
    import sdkit

    shapes = {k: v.shape for k, v in feeds.items()}
    compiled = sdkit.compile(path, backend=runner, input_shapes=shapes, threads=threads, precision=precision)
    return lambda: compiled.run(feeds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runner", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--shapes", default="{}")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--outputs", required=True)
    args = parser.parse_args()
    path = model_path(args.model)
    feeds = example_feeds(args.model, path, json.loads(args.shapes))
    start = time.perf_counter()
    run = compile_runner(args.runner, path, feeds, args.threads, args.precision)
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        run()
    times = []
    outputs: dict[str, np.ndarray] = {}
    for _ in range(args.repeat):
        start = time.perf_counter()
        outputs = run()
        times.append(time.perf_counter() - start)
    np.savez(args.outputs, **{k: np.asarray(v) for k, v in outputs.items()})
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({
        "runner": args.runner,
        "compile_s": compile_s,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "peak_rss_mb": peak_mb,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
