"""One engine on one case, in a process of its own (see run.py); prints one JSON line.

    python benchmarks/worker.py --engine ggml-fp32 --case vae256 --repeat 5 --outputs out.npz

Engines on the ONNX graphs: ``ggml-fp32``, ``ggml-fp16``, ``ggml-q8_0`` (sdkit-ggml), ``sdkit-openvino``,
``openvino`` (raw OpenVINO: ``Core.read_model`` on the ONNX file, inputs reshaped to the case's
static shapes, ``compile_model`` on CPU with the thread count, nothing else), ``onnxruntime``
(its own API, CPU execution provider, intra-op threads). stable-diffusion.cpp has its own
worker (sdcpp_worker.py). Times are wall-clock seconds of ``run()`` (inputs in, outputs out as
numpy arrays), after ``--warmup`` untimed runs; ``compile_s`` is load + compile of the model
for the case's shapes; ``peak_rss_mb`` is this process's high-water mark (ru_maxrss); ``weights_mb``
(sdkit-ggml) the weight buffer on the device (``memory()``, exact).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases

Run = Callable[[], dict[str, np.ndarray]]
MEMORY: dict[str, float] = {}  # sdkit-ggml's weight buffer, once compiled


def onnxruntime_runner(path: Path, feeds: dict[str, np.ndarray], threads: int) -> Run:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda: dict(zip(names, session.run(None, feeds), strict=True))


def openvino_runner(path: Path, feeds: dict[str, np.ndarray], threads: int) -> Run:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    model.reshape({name: ov.PartialShape(list(value.shape)) for name, value in feeds.items()})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    names = [next(iter(o.get_names())) for o in compiled.outputs]

    def run() -> dict[str, np.ndarray]:
        request.infer(feeds)
        return {name: np.array(request.get_output_tensor(i).data, copy=True) for i, name in enumerate(names)}

    return run


def sdkit_runner(backend: str, precision: str, path: Path, feeds: dict[str, np.ndarray], threads: int) -> Run:
    import sdkit

    shapes = {k: v.shape for k, v in feeds.items()}
    compiled = sdkit.compile(path, backend=backend, input_shapes=shapes, threads=threads, precision=precision)
    compiled.run(feeds)  # ggml builds its graph on the first run: count that as compile
    memory = getattr(compiled, "memory", None)
    if backend == "ggml" and memory is not None:
        MEMORY["weights_mb"] = memory()["weights"] / 2**20
    info = getattr(compiled, "info", None)
    if backend == "ggml" and isinstance(info, dict) and "conv_strategies" in info:
        chosen = list(info["conv_strategies"].values())  # conv shapes per strategy (SDKIT_GGML_CONV)
        MEMORY["conv"] = {s: chosen.count(s) for s in sorted(set(chosen))}  # type: ignore[assignment]
    return lambda: compiled.run(feeds)


def make_runner(engine: str, path: Path, feeds: dict[str, np.ndarray], threads: int) -> Run:
    if engine == "onnxruntime":
        return onnxruntime_runner(path, feeds, threads)
    if engine == "openvino":
        return openvino_runner(path, feeds, threads)
    if engine == "sdkit-openvino":
        return sdkit_runner("openvino", "fp32", path, feeds, threads)
    if engine in ("ggml-fp32", "ggml-fp16", "ggml-q8_0"):
        return sdkit_runner("ggml", engine.split("-")[1], path, feeds, threads)
    raise SystemExit(f"unknown engine {engine!r}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True)
    parser.add_argument("--case", required=True, choices=sorted(cases.CASES))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--outputs", required=True)
    args = parser.parse_args()
    case = cases.CASES[args.case]
    path = cases.model_path(case)
    feeds = cases.feeds(case)
    start = time.perf_counter()
    run = make_runner(args.engine, path, feeds, args.threads)
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
    print(json.dumps({"engine": args.engine, "case": args.case, "compile_s": compile_s, "times": times,
                      "peak_rss_mb": peak_mb, **MEMORY}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
