"""TensorRT(-RTX) against onnxruntime CPU (and ggml CPU when sdkit-ggml is installed).

    nice python benchmarks/trt_bench.py [--models taef2,sd15_vae_decoder] [--latent 64] [--repeat 5]

Prints one table per model: compile time (cold, then from the artifact cache), median run
time over ``--repeat`` runs after one warm-up, ratio to the fastest, and max |diff| against
onnxruntime fp32. On a machine without an NVIDIA GPU the tensorrt rows say why they are
missing and the CPU rows still run. Models: the TAEF2 decoder (``models/taef2``) and the SD
1.5 VAE decoder from the repository's fixtures (random weights), when present.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def load(name: str, latent: int) -> tuple[object, dict[str, np.ndarray]] | None:
    from sdkit.model import Model, load_onnx

    if name == "taef2":
        for folder in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
            if (folder / "taef2_decoder.onnx").is_file():
                model = load_onnx(folder / "taef2_decoder.onnx")
                rng = np.random.default_rng(0)
                return model, {"latent": rng.standard_normal((1, 32, latent, latent)).astype(np.float32)}
        return None
    sys.path.insert(0, str(REPO / "fixtures"))
    try:
        import sd_graphs  # type: ignore[import-not-found]

        model = Model.from_proto(sd_graphs.load_model(name, seed=0))
    except Exception as exc:
        print(f"{name}: fixture unavailable ({exc})")
        return None
    channels = model.inputs[0].shape[1]
    rng = np.random.default_rng(0)
    return model, {model.inputs[0].name: rng.standard_normal((1, channels, latent, latent)).astype(np.float32)}


def median_time(run: Callable[[], object], repeat: int) -> float:
    run()  # warm-up (TensorRT-RTX JIT, allocations)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def onnxruntime_row(model: object, feeds: dict[str, np.ndarray], repeat: int) -> tuple[str, float, float, np.ndarray]:
    import onnxruntime as ort

    proto = model.graph.with_input_shapes({k: v.shape for k, v in feeds.items()}).to_onnx(model.weights)  # type: ignore[attr-defined]
    proto.ir_version = min(proto.ir_version, 10)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        import onnx

        onnx.save_model(proto, str(path), save_as_external_data=True, location="model.data")
        start = time.perf_counter()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        setup = time.perf_counter() - start
        out = session.run(None, feeds)[0]
        seconds = median_time(lambda: session.run(None, feeds), repeat)
    return "onnxruntime cpu fp32", setup, seconds, np.asarray(out)


def sdkit_rows(
    model: object, feeds: dict[str, np.ndarray], repeat: int, backend: str, precisions: list[str]
) -> list[tuple[str, str, float, np.ndarray | None]]:
    import sdkit

    rows: list[tuple[str, str, float, np.ndarray | None]] = []
    for precision in precisions:
        label = f"{backend} {precision}"
        try:
            compiled_times = []
            for _ in range(2):  # cold, then from the artifact cache
                start = time.perf_counter()
                compiled = sdkit.compile(
                    model, backend=backend, input_shapes={k: v.shape for k, v in feeds.items()}, precision=precision
                )
                out = next(iter(compiled.run(feeds).values()))
                compiled_times.append(time.perf_counter() - start)
            seconds = median_time(lambda c=compiled: c.run(feeds), repeat)
            compiled.close()
            rows.append((label, f"{compiled_times[0]:.1f} s / {compiled_times[1]:.1f} s", seconds, out))
        except sdkit.SdkitError as exc:
            rows.append((label, "unavailable", float("nan"), None))
            print(f"{label}: {exc}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="taef2,sd15_vae_decoder")
    parser.add_argument("--latent", type=int, default=64, help="latent height and width (64 -> 512 px)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import sdkit

    print(
        f"sdkit {sdkit.__version__}; backends: "
        + ", ".join(f"{b.name} ({'ok' if b.available else b.reason})" for b in sdkit.backends())
    )
    for name in args.models.split(","):
        loaded = load(name, args.latent)
        if loaded is None:
            continue
        model, feeds = loaded
        label, setup, seconds, reference = onnxruntime_row(model, feeds, args.repeat)
        rows = [(label, f"{setup:.1f} s", seconds, reference)]
        rows += sdkit_rows(model, feeds, args.repeat, "tensorrt", ["fp32", "fp16"])
        rows += sdkit_rows(model, feeds, args.repeat, "ggml", ["fp32"])
        fastest = min((r[2] for r in rows if r[2] == r[2]), default=float("nan"))
        print(f"\n{name}, input {list(next(iter(feeds.values())).shape)}, median of {args.repeat} runs")
        print(f"{'backend':<22} {'compile (cold / cached)':<32} {'run':>10} {'x fastest':>10} {'max |diff|':>11}")
        for label, compile_text, seconds, out in rows:
            diff = (
                f"{float(np.abs(out - reference).max()):.2e}"
                if out is not None and out.shape == reference.shape
                else "-"
            )
            run_text = f"{seconds * 1000:.1f} ms" if seconds == seconds else "-"
            ratio = f"{seconds / fastest:.2f}" if seconds == seconds else "-"
            print(f"{label:<22} {compile_text[:32]:<32} {run_text:>10} {ratio:>10} {diff:>11}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
