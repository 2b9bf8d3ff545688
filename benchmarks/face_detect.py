"""Face detection (RetinaFace) and parsing (ParseNet) on sdkit's backends vs onnxruntime, on the
shipped full-size graphs with seeded random weights (the values of ``fixtures/faces/detect``'s
goldens; the speed does not depend on them).

    python benchmarks/face_detect.py [--models resnet50,mobilenet,parsenet] [--backends ggml,openvino]
                                     [--size 480x640] [--repeat 3] [--threads 2]

Per model: onnxruntime (peer; the graph filled with the weights) and each sdkit backend run the
same input (RetinaFace: an RGB image of ``--size``, through ``RetinaFaceDetector.raw_outputs``;
ParseNet: a 512 x 512 face through ``ParseNetParser.logits``): compile + first run seconds, the
median of ``--repeat`` runs after that, the ratio to onnxruntime, and the max |diff| vs
onnxruntime relative to the output's largest magnitude.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "faces" / "detect"
# model -> (goldens file, case whose weights it uses, graph)
MODELS = {
    "resnet50": ("goldens.json", "net_resnet50_33x47", "retinaface_resnet50"),
    "mobilenet": ("goldens.json", "net_mobilenet025_33x47", "retinaface_mobilenet025"),
    "parsenet": ("parsenet_goldens.json", "parse_512x512", "parsenet_b64_x256_d4_u4_r10_c19"),
}


def weights_file(model: str, folder: Path) -> Path:
    spec = importlib.util.spec_from_file_location("face_weights", FIXTURES / "face_weights.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    record, case, _ = MODELS[model]
    facts = json.loads((FIXTURES / record).read_text())["cases"][case]
    path = folder / f"{model}.safetensors"
    save_file(module.random_values([(k, s) for k, s in facts["entries"]], facts["seed"]), str(path))
    return path


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    start = time.perf_counter()
    out = fn()
    first = time.perf_counter() - start
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return first, statistics.median(runs), out


def onnxruntime_peer(model: str, path: Path, feed: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    import onnxruntime as ort
    from onnx import helper

    from sdkit.families.safetensors_reader import SafetensorsFile
    from sdkit.families.shipped import load_graph

    proto = load_graph(MODELS[model][2]).proto
    stub = type(proto)()
    stub.CopyFrom(proto)
    for t in proto.graph.initializer:
        stub.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del stub.graph.initializer[:]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(stub.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    file = SafetensorsFile(path)
    fixed = {t.name: file.read(file.entries[t.name], np.float32) for t in proto.graph.initializer}
    name = proto.graph.input[0].name
    return lambda: session.run(None, {**fixed, name: feed})[0]


def sdkit_runner(model: str, path: Path, backend: str, threads: int, feed: np.ndarray) -> Callable[[], np.ndarray]:
    options: dict[str, Any] = {"threads": threads} if backend == "ggml" else {}
    if model == "parsenet":
        from sdkit.pipelines.stages.parsenet import ParseNetParser

        parser = ParseNetParser(path, backend=backend, **options)
        return lambda: parser.logits(feed)[None]
    from sdkit.pipelines.stages.retinaface import RetinaFaceDetector

    detector = RetinaFaceDetector(path, backend=backend, **options)
    return lambda: detector.raw_outputs(feed)[0][None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,mobilenet,parsenet")
    ap.add_argument("--backends", default="ggml,openvino")
    ap.add_argument("--size", default="480x640", help="RetinaFace image HxW")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    h, w = (int(v) for v in args.size.split("x"))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            path = weights_file(model, Path(tmp))
            sdkit_in: np.ndarray
            if model == "parsenet":
                sdkit_in = rng.random((512, 512, 3), dtype=np.float32)
                peer_in = np.ascontiguousarray(((sdkit_in - 0.5) / 0.5).transpose(2, 0, 1)[None])
            else:
                sdkit_in = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                bgr = sdkit_in[:, :, ::-1].astype(np.float32) - np.array([104, 117, 123], np.float32)
                peer_in = np.ascontiguousarray(bgr.transpose(2, 0, 1)[None])
            first, median, want = timed(onnxruntime_peer(model, path, peer_in, args.threads), args.repeat)
            print(f"{model}: onnxruntime first {first:.2f} s, median {median:.3f} s", flush=True)
            for backend in args.backends.split(","):
                start = time.perf_counter()
                run = sdkit_runner(model, path, backend, args.threads, sdkit_in)
                compile_s = time.perf_counter() - start
                b_first, b_median, got = timed(run, args.repeat)
                rel = float(np.abs(got - want).max() / np.abs(want).max())
                print(
                    f"{model}: {backend} compile+first {compile_s + b_first:.2f} s, median {b_median:.3f} s "
                    f"({b_median / median:.2f}x onnxruntime), max |diff| {rel:.1e} of scale",
                    flush=True,
                )


if __name__ == "__main__":
    main()
