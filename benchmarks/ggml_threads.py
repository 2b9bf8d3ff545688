"""ggml's CPU threads on a loaded machine: the thread policy and thread pool settings of
sdkit_ggml/runtime/threads.py, at 1 and 2 threads, with and without busy loops started here.

    python benchmarks/ggml_threads.py [--graphs x4plus,tiny_unet] [--size 32] [--repeat 5] [--load 0,2]

Per graph (ESRGAN x4plus from the upscaler family, seeded random weights, an image of --size;
the tiny SD UNet from fixtures/sd_graphs.py) and per load (N busy-loop processes started and
stopped by this script, on top of whatever else the machine runs: its load average is printed):
onnxruntime at 1 and 2 threads and sdkit-ggml at 1 and 2 threads under each setting
(``SDKIT_GGML_THREADS_POLICY`` fixed / idle, ``SDKIT_GGML_THREADPOOL_POLL`` unset / 0), one
warm-up run each, then --repeat rounds in which every engine runs once in turn; the median, the
ratio to onnxruntime at the same thread count, and whether the ggml outputs are bit-identical to
ggml's at 1 thread (threading must not change results).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(HERE))

SETTINGS = {  # name -> environment
    "fixed": {"SDKIT_GGML_THREADS_POLICY": "fixed"},
    "fixed+pool0": {"SDKIT_GGML_THREADS_POLICY": "fixed", "SDKIT_GGML_THREADPOOL_POLL": "0"},
    "idle": {"SDKIT_GGML_THREADS_POLICY": "idle"},
}


def spin() -> None:
    while True:
        pass


def graph_and_feeds(name: str, size: int, folder: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """(sdkit Model, feeds)."""
    from sdkit.model import Model

    if name == "tiny_unet":
        import sd_graphs

        return Model.from_proto(sd_graphs.load_model(name)), sd_graphs.example_inputs(name)
    from upscaler import CONFIGS, case_file

    from sdkit.families.upscalers import UpscalerFile, find_graph

    file = UpscalerFile(case_file(CONFIGS[name], folder))
    graph = find_graph(file.config)
    side = size - size % file.config.multiple_of
    feeds = {"image": np.random.default_rng(0).random((1, 3, side, side), dtype=np.float32)}
    return Model(graph, file.weights(graph)), feeds


def engines(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, Callable[[], np.ndarray]]:
    import onnxruntime as ort

    import sdkit

    proto = model.graph.to_onnx(model.weights).SerializeToString()
    runs: dict[str, Callable[[], np.ndarray]] = {}
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
        runs[f"onnxruntime t{threads}"] = lambda s=session: s.run(None, feeds)[0]
    for threads in (1, 2):
        compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=threads)
        for setting in SETTINGS if threads > 1 else ("fixed",):
            runs[f"ggml t{threads} {setting}"] = lambda c=compiled, s=setting: with_env(SETTINGS[s], c, feeds)
    return runs


def with_env(env: dict[str, str], compiled: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    saved = {k: os.environ.get(k) for k in (*SETTINGS["fixed+pool0"], *env)}
    for k in saved:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        return next(iter(compiled.run(feeds).values()))
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def measure(runs: dict[str, Callable[[], np.ndarray]], repeat: int) -> dict[str, Any]:
    outputs = {name: run() for name, run in runs.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    want = outputs["ggml t1 fixed"]
    rows = {}
    for name in runs:
        median = statistics.median(times[name])
        peer = statistics.median(times["onnxruntime t2" if "t2" in name else "onnxruntime t1"])
        same = bool(np.array_equal(outputs[name], want)) if name.startswith("ggml") else None
        rows[name] = (median, median / peer, same)
    return rows


def main() -> None:
    from machine import cpuinfo

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="x4plus,tiny_unet")
    ap.add_argument("--size", type=int, default=32, help="upscaler image side")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--load", default="0,2", help="busy-loop processes to start, per measurement")
    args = ap.parse_args()
    model_name, flags = cpuinfo()
    print(f"CPU: {model_name} ({os.cpu_count()} logical), {' '.join(flags)}")
    with tempfile.TemporaryDirectory() as tmp:
        for graph in args.graphs.split(","):
            model, feeds = graph_and_feeds(graph, args.size, Path(tmp))
            runs = engines(model, feeds)
            for load in (int(v) for v in args.load.split(",")):
                spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(load)]
                for p in spinners:
                    p.start()
                try:
                    time.sleep(1.0 if load else 0.0)
                    rows = measure(runs, args.repeat)
                    avg = os.getloadavg()[0]
                finally:
                    for p in spinners:
                        p.terminate()
                        p.join()
                print(f"\n{graph}, +{load} busy loops (load average {avg:.1f}):")
                for name, (median, ratio, same) in rows.items():
                    tail = "" if same is None else f"  bit-identical to ggml t1: {same}"
                    print(f"  {name:24s} {median:8.3f} s  {ratio:6.2f}x onnxruntime{tail}")


if __name__ == "__main__":
    main()
