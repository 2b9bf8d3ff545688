"""sdkit-ggml on an NVIDIA GPU against PyTorch (diffusers) on the same GPU, in one run.

    python benchmarks/ggml_cuda.py [--cases unet512,vae512,taef2] [--repeat 10] [--vae-sizes 1024,2048]
    SDKIT_GGML_LIB_DIR=<a ggml build with GGML_CUDA=ON> python benchmarks/ggml_cuda.py

Rows, each engine in a process of its own (the next one starts with the GPU empty):

- ``ggml-fp32`` / ``ggml-fp16``: ``sdkit.compile(..., backend="ggml", device="cuda:0")`` of the
  fixture graphs (``fixtures/sd_graphs.py``: the real SD 1.5 UNet and VAE decoder with seeded
  random weights; TAEF2 with its real weights). fp16 stores matrix and conv weights as F16
  (activations F32), as on the CPU.
- ``torch-fp32`` / ``torch-fp16``: diffusers' ``UNet2DConditionModel`` / ``AutoencoderKL`` with the
  SD 1.5 configs (random init; same input shapes, other weights: a speed peer only), SDPA
  attention, ``torch.inference_mode``, timed with ``torch.cuda.synchronize``. TAEF2 has no row.
- ``onnxruntime`` (CPU, all cores): the oracle. Each ggml output is compared with it (max |diff|,
  relative L2); first-run time only.

Per row: compile seconds (ggml: load + graph build + first run), median and min of ``--repeat``
runs after one warm-up, ratio to torch-fp16, and device memory (ggml: its weight and compute
buffers; torch: ``max_memory_allocated``). ``--vae-sizes`` adds the VAE decoder at large sizes,
untiled against tiled (``sdkit.pipelines.stages.vae.decode`` with 512 px tiles, as ``--vae-tiling``),
on ggml-fp32 on the GPU: seconds and the process's device memory as NVML reports it after the
decode (buffers, CUDA pool and context). The JSON report goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
DEVICE = os.environ.get("SDKIT_BENCH_DEVICE", "cuda:0")  # "cpu": a dry run of the script itself

UNET_CONFIG = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
}
VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 4,
    "sample_size": 512,
}


def timed(run: Any, repeat: int, sync: Any = None) -> list[float]:
    run()  # warm-up
    if sync:
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return times


def nvml_used_mb() -> float | None:
    """This process's device memory as NVML sees it (None where NVML cannot say)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                return float(proc.usedGpuMemory) / 2**20
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / 2**20  # whole device
    except Exception:
        return None


def worker_ggml(case_name: str, precision: str, repeat: int, out: str) -> dict[str, Any]:
    import cases

    import sdkit

    case = cases.CASES[case_name]
    feeds = cases.feeds(case)
    start = time.perf_counter()
    compiled = sdkit.compile(
        cases.model_path(case), backend="ggml", device=DEVICE, precision=precision,
        input_shapes={k: v.shape for k, v in feeds.items()},
    )  # fmt: skip
    outputs = compiled.run(feeds)
    compile_s = time.perf_counter() - start
    times = timed(lambda: compiled.run(feeds), repeat)
    np.savez(out, **{k: np.asarray(v) for k, v in outputs.items()})
    memory = compiled.memory()
    return {"compile_s": compile_s, "times": times, "device_mb": (memory["weights"] + memory["compute"]) / 2**20,
            "weights_mb": memory["weights"] / 2**20, "device": DEVICE}  # fmt: skip


def worker_onnxruntime(case_name: str, out: str) -> dict[str, Any]:
    import cases
    import onnxruntime as ort

    case = cases.CASES[case_name]
    feeds = cases.feeds(case)
    session = ort.InferenceSession(str(cases.model_path(case)), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, feeds)
    np.savez(out, **dict(zip(names, values, strict=True)))
    return {"compile_s": 0.0, "times": [time.perf_counter() - start]}


def worker_torch(case_name: str, precision: str, repeat: int) -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    dtype = torch.float16 if precision == "fp16" else torch.float32
    gen = torch.Generator("cpu").manual_seed(0)
    start = time.perf_counter()
    if case_name.startswith("unet"):
        side = 64 if case_name == "unet512" else 32
        with torch.device("cuda"):  # random init on the GPU: seconds, not a minute
            model = UNet2DConditionModel(**UNET_CONFIG).to(dtype).eval()
        sample = torch.randn(1, 4, side, side, generator=gen).to("cuda", dtype)
        text = torch.randn(1, 77, 768, generator=gen).to("cuda", dtype)
        step = torch.tensor([999.0], device="cuda")

        def run() -> Any:
            with torch.inference_mode():
                return model(sample, step, encoder_hidden_states=text).sample
    elif case_name.startswith("vae"):
        side = {"vae128": 16, "vae256": 32, "vae512": 64}[case_name]
        with torch.device("cuda"):
            model = AutoencoderKL(**VAE_CONFIG).to(dtype).eval()
        latent = torch.randn(1, 4, side, side, generator=gen).to("cuda", dtype)

        def run() -> Any:
            with torch.inference_mode():
                return model.decode(latent).sample
    else:
        return {"skipped": "no PyTorch counterpart"}
    run()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    times = timed(run, repeat, torch.cuda.synchronize)
    return {"compile_s": compile_s, "times": times, "device_mb": torch.cuda.max_memory_allocated() / 2**20,
            "device": torch.cuda.get_device_name(0)}  # fmt: skip


def worker_vae_large(size: int, tiled: bool, out: str) -> dict[str, Any]:
    import cases

    from sdkit.pipelines.config import PipelineConfig
    from sdkit.pipelines.stages import vae
    from sdkit.pipelines.stages.components import Component
    from sdkit.pipelines.stages.sources import OnnxFileSource

    path = cases.model_path(cases.CASES["vae512"])
    latents = np.random.default_rng(0).standard_normal((1, 4, size // 8, size // 8)).astype(np.float32) * 0.18215
    decoder = Component("vae_decoder", OnnxFileSource(Path(path)), "ggml", DEVICE, {}, "keep")
    baseline = nvml_used_mb()
    start = time.perf_counter()
    pixels = vae.decode(decoder, latents, PipelineConfig(name="sd15"), 512 if tiled else None)
    seconds = time.perf_counter() - start
    again = time.perf_counter()
    vae.decode(decoder, latents, PipelineConfig(name="sd15"), 512 if tiled else None)
    np.save(out, pixels[:, ::8, ::8])  # a subsample: enough to compare tiled with untiled
    return {"first_s": seconds, "second_s": time.perf_counter() - again, "device_mb": nvml_used_mb(),
            "baseline_mb": baseline}  # fmt: skip


def spawn(args: list[str], timeout: float) -> dict[str, Any]:
    try:
        command = [sys.executable, __file__, *args]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def compare(ours: str, oracle: str) -> dict[str, float]:
    a, b = np.load(ours), np.load(oracle)
    key = next(iter(b.files))
    x, y = a[next(iter(a.files))].astype(np.float64), b[key].astype(np.float64)
    return {"max_abs": float(np.max(np.abs(x - y))), "rel_l2": float(np.linalg.norm(x - y) / np.linalg.norm(y))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="unet512,vae512,taef2")
    parser.add_argument("--engines", default="ggml-fp32,ggml-fp16,torch-fp32,torch-fp16")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--vae-sizes", default="1024,2048")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out", default=str(ROOT / "results" / "ggml_cuda.json"))
    parser.add_argument("--scratch", default=str(ROOT / "results" / "ggml_cuda"), help="the outputs compared")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    if args.worker:
        kind, *rest = args.worker.split(":")
        if kind == "ggml":
            result = worker_ggml(rest[0], rest[1], args.repeat, rest[2])
        elif kind == "onnxruntime":
            result = worker_onnxruntime(rest[0], rest[1])
        elif kind == "torch":
            result = worker_torch(rest[0], rest[1], args.repeat)
        else:
            result = worker_vae_large(int(rest[0]), rest[1] == "tiled", rest[2])
        print(json.dumps(result), flush=True)
        return 0

    report: dict[str, Any] = {"machine": platform.node(), "python": platform.python_version(), "rows": []}
    try:
        report["gpu"] = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True).stdout.strip()
    except OSError:
        report["gpu"] = "?"
    print(f"# {report['gpu']}; ggml from SDKIT_GGML_LIB_DIR={os.environ.get('SDKIT_GGML_LIB_DIR', '(default)')}")
    for case in args.cases.split(","):
        oracle = str(scratch / f"ort-{case}.npz")
        ort = spawn(["--worker", f"onnxruntime:{case}:{oracle}"], args.timeout)
        rows = []
        for engine in args.engines.split(","):
            kind, precision = engine.split("-")
            out = str(scratch / f"{engine}-{case}.npz")
            worker = f"ggml:{case}:{precision}:{out}" if kind == "ggml" else f"torch:{case}:{precision}"
            measured = spawn(["--worker", worker, "--repeat", str(args.repeat)], args.timeout)
            row = {"case": case, "engine": engine, **measured}
            if kind == "ggml" and "times" in row and "error" not in ort:
                row.update(compare(out, oracle))
            rows.append(row)
        peer = next((r for r in rows if r["engine"] == "torch-fp16" and "times" in r), None)
        print(f"\n## {case}  (onnxruntime CPU first run: {ort.get('times', [float('nan')])[0]:.2f} s)")
        print("| engine | compile s | median ms | min ms | x torch-fp16 | device MB | max abs vs ort | rel-L2 vs ort |")
        print("|---|---|---|---|---|---|---|---|")
        for row in rows:
            if "times" not in row:
                print(f"| {row['engine']} | {row.get('error') or row.get('skipped')} |")
                continue
            med = statistics.median(row["times"])
            ratio = med / statistics.median(peer["times"]) if peer else float("nan")
            print(f"| {row['engine']} | {row['compile_s']:.2f} | {med * 1e3:.1f} | {min(row['times']) * 1e3:.1f} | "
                  f"{ratio:.2f} | {row.get('device_mb', float('nan')):.0f} | {row.get('max_abs', float('nan')):.2e} | "
                  f"{row.get('rel_l2', float('nan')):.2e} |", flush=True)  # fmt: skip
        report["rows"].extend(rows)
    if args.vae_sizes:
        print("\n## SD 1.5 VAE decoder on ggml-fp32 (GPU): untiled vs tiled (512 px tiles)")
        print("| size | mode | first s | second s | process device MB (NVML) |")
        print("|---|---|---|---|---|")
        for size in (int(s) for s in args.vae_sizes.split(",")):
            images = {}
            for mode in ("untiled", "tiled"):
                out = str(scratch / f"vae{size}-{mode}.npy")
                measured = spawn(["--worker", f"vae:{size}:{mode}:{out}"], args.timeout)
                row = {"case": f"vae{size}", "mode": mode, **measured}
                report["rows"].append(row)
                if "error" in row:
                    print(f"| {size} | {mode} | {row['error']} |")
                    continue
                images[mode] = np.load(out)
                seconds = f"{row['first_s']:.2f} | {row['second_s']:.2f}"
                print(f"| {size} | {mode} | {seconds} | {row['device_mb']} |", flush=True)
            if len(images) == 2:
                diff = float(np.max(np.abs(images["tiled"] - images["untiled"])))
                print(f"| {size} | tiled vs untiled | max abs diff (every 8th pixel) {diff:.3e} | | |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
