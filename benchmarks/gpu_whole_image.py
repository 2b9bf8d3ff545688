"""Whole images on one GPU: sdkit on ggml (cuda:N / vulkan:N, fp32 and fp16) against eager
PyTorch (diffusers' modules, fp16 and fp32) and stable-diffusion.cpp, in one run (issue 31).

    python benchmarks/gpu_whole_image.py [--out FILE] [--models sd1,sdxl] [--runs 5]
    python benchmarks/gpu_whole_image.py --tiny        # the script itself, on the CPU, in a minute

Per model (SD 1.5 at 512 px, SDXL base at 1024 px; full-size architectures, random fp16 weights
as one single-file checkpoint, ``random_checkpoint.py``): txt2img, 20 Euler steps, CFG 7.5 (the
UNet runs at batch 2), every row a whole ``generate()`` call (text encoders, every step, VAE
decode), each engine in a process of its own. Warm-up repeats whole calls until two in a row
agree within 5% (at least ``--min-warmup``, at most ``--max-warmup``), then ``--runs`` timed
calls give the median. ``first_s`` is the first call after load (graph building, allocation,
GPU clocks), reported beside the median. The SD 1.5 rows also time the VAE decoder alone at
512 and 1024 px (``vae``). Rows:

- ``torch-fp16`` / ``torch-fp32``: diffusers' ``UNet2DConditionModel``, ``AutoencoderKL``,
  transformers' CLIP text models (random init: same architecture, other weights; a speed peer),
  SDPA attention, ``torch.inference_mode``, diffusers' ``EulerDiscreteScheduler``; the prompts
  are fixed token ids (no tokenizer). Skipped, saying so, where diffusers or transformers is
  missing (PyTorch alone has no SD modules: no other PyTorch row is substituted);
  ``--torch-python`` runs them with another interpreter (a venv that has them).
- ``sdkit-<device>-<precision>``: ``sdkit.load_pipeline(checkpoint, backend="ggml", device=...,
  precision=...)`` and ``pipe.generate(..., sampler="euler", output_type="np")``, for every
  ggml device but the CPU (``cuda:0``, ``vulkan:0``... whatever the loaded ggml build lists).
- ``sdcpp``: stable-diffusion-cpp-python (built with ``CMAKE_ARGS="-DSD_CUDA=ON"``) on the same
  checkpoint, Euler, cfg 7.5; skipped with the reason where it is not installed.

``--tiny`` proves the script on a CPU: the tiny fixture pipelines (``fixtures/tiny_xl/sd15``,
``.../sdxl``: ONNX folders whose ``config.json`` files give PyTorch the same tiny modules) at
64 px, on ggml's ``cpu`` device, no stable-diffusion.cpp. Output: one JSON (``--out``) with the
GPU's name, driver and compute capability, versions, and every row; a table on stdout.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

PROMPT, STEPS, CFG = "a photo of an astronaut riding a horse", 20, 7.5
FULL = {"sd1": ("sd1", 512), "sdxl": ("sdxl", 1024)}
TINY = {"sd1": (ROOT / "fixtures/tiny_xl/sd15", 64), "sdxl": (ROOT / "fixtures/tiny_xl/sdxl", 64)}
SDXL_UNET_DIFFUSERS = {
    "sample_size": 128,
    "block_out_channels": [320, 640, 1280],
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "transformer_layers_per_block": [1, 2, 10],
    "attention_head_dim": [5, 10, 20],
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}
SD1_UNET_DIFFUSERS = {"sample_size": 64, "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 768}
VAE_DIFFUSERS = {
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2,
    "latent_channels": 4,
}
CLIP_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "hidden_act": "quick_gelu", "projection_dim": 768}  # fmt: skip
CLIP_BIGG = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
             "hidden_act": "gelu", "projection_dim": 1280}  # fmt: skip


# --- timing ------------------------------------------------------------------------------------


def settle(
    run: Callable[[], Any], runs: int, min_warmup: int, max_warmup: int, sync: Callable[[], Any]
) -> dict[str, Any]:
    """Whole calls until two warm-up times agree within 5%, then ``runs`` timed ones."""

    def once() -> float:
        start = time.perf_counter()
        run()
        sync()
        return time.perf_counter() - start

    warm: list[float] = []
    while len(warm) < max(max_warmup, 1):
        warm.append(once())
        if len(warm) >= max(min_warmup, 2) and abs(warm[-1] - warm[-2]) <= 0.05 * warm[-2]:
            break
    settled = len(warm) >= 2 and abs(warm[-1] - warm[-2]) <= 0.05 * warm[-2]
    times = [once() for _ in range(runs)]
    median = statistics.median(times)
    return {"first_s": warm[0], "warmup_s": warm, "settled": settled, "times_s": times, "median_s": median,
            "min_s": min(times), "first_minus_median_s": warm[0] - median}  # fmt: skip


# --- PyTorch (diffusers) -----------------------------------------------------------------------


def _torch_configs(model: str, tiny: bool) -> dict[str, Any]:
    if tiny:
        folder = TINY[model][0]
        read = lambda part: json.loads((folder / part / "config.json").read_text())  # noqa: E731
        encoders = ["text_encoder"] + (["text_encoder_2"] if model == "sdxl" else [])
        return {"unet": read("unet"), "vae": read("vae_decoder"), "text": [read(e) for e in encoders]}
    if model == "sdxl":
        return {"unet": SDXL_UNET_DIFFUSERS, "vae": {**VAE_DIFFUSERS, "scaling_factor": 0.13025},
                "text": [CLIP_L, CLIP_BIGG]}  # fmt: skip
    return {"unet": SD1_UNET_DIFFUSERS, "vae": {**VAE_DIFFUSERS, "scaling_factor": 0.18215}, "text": [CLIP_L]}


def _torch_modules(model: str, tiny: bool, dtype: Any, device: str) -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = _torch_configs(model, tiny)
    keep = set(CLIPTextConfig().to_dict())
    with torch.device(device):  # random init where it runs: seconds, not a minute
        unet = UNet2DConditionModel.from_config(config["unet"]).to(dtype).eval()
        vae = AutoencoderKL.from_config(config["vae"]).to(dtype).eval()
        texts = []
        for i, text in enumerate(config["text"]):
            cls = CLIPTextModelWithProjection if i == 1 else CLIPTextModel
            cfg = CLIPTextConfig(**{k: v for k, v in text.items() if k in keep})
            texts.append(cls(cfg).to(dtype).eval())
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       timestep_spacing="leading", steps_offset=1)  # fmt: skip
    return {"unet": unet, "vae": vae, "texts": texts, "scheduler": scheduler, "device": device, "dtype": dtype}


def _torch_text(m: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import torch

    ids = torch.full((2, 77), 7, dtype=torch.long, device=m["device"])
    if len(m["texts"]) == 1:
        return m["texts"][0](ids).last_hidden_state, {}
    first = m["texts"][0](ids, output_hidden_states=True)
    second = m["texts"][1](ids, output_hidden_states=True)
    hidden = torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1)
    return hidden, {"text_embeds": second.text_embeds, "time_ids": torch.zeros_like(second.text_embeds[:, :6])}


def torch_worker(model: str, tiny: bool, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    try:
        import diffusers  # noqa: F401
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"{exc.name} is not installed here: no PyTorch row (PyTorch alone has no SD modules)"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if precision == "fp16" else torch.float32
    start = time.perf_counter()
    m = _torch_modules(model, tiny, dtype, device)
    size = args.size or (TINY if tiny else FULL)[model][1]
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None

    def generate() -> Any:
        with torch.inference_mode():
            text, added = _torch_text(m)
            scheduler = m["scheduler"]
            scheduler.set_timesteps(args.steps, device=device)
            latents = torch.randn(1, 4, size // 8, size // 8, device=device, dtype=dtype) * scheduler.init_noise_sigma
            for t in scheduler.timesteps:
                x = scheduler.scale_model_input(torch.cat([latents] * 2), t)
                eps = m["unet"](x, t, encoder_hidden_states=text, added_cond_kwargs=added or None).sample
                uncond, cond = eps.chunk(2)
                latents = scheduler.step(uncond + CFG * (cond - uncond), t, latents).prev_sample
            return m["vae"].decode(latents / m["vae"].config.scaling_factor).sample.float().cpu()

    load_s = time.perf_counter() - start
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    timed = settle(generate, args.runs, args.min_warmup, args.max_warmup, sync)
    result = {"load_s": load_s, "device": name, "torch": torch.__version__, **timed}
    if model == "sd1":
        result["vae"] = {str(px): _torch_vae(m, px, args) for px in args.vae_sizes}
    return result


def _torch_vae(m: dict[str, Any], px: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    latents = torch.randn(1, 4, px // 8, px // 8, device=m["device"], dtype=m["dtype"])
    sync = torch.cuda.synchronize if m["device"] == "cuda" else lambda: None

    def decode() -> Any:
        with torch.inference_mode():
            return m["vae"].decode(latents).sample

    return settle(decode, args.runs, args.min_warmup, args.max_warmup, sync)


# --- sdkit on ggml, stable-diffusion.cpp -------------------------------------------------------


def sdkit_worker(model: str, path: str, device: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    import sdkit

    size = args.size or (TINY if args.tiny else FULL)[model][1]
    start = time.perf_counter()
    threads = {"threads": args.threads} if args.threads else {}
    pipe = sdkit.load_pipeline(path, backend="ggml", device=device, precision=precision, **threads)
    load_s = time.perf_counter() - start

    def generate() -> Any:
        return pipe.generate(PROMPT, width=size, height=size, steps=args.steps, guidance_scale=CFG, sampler="euler",
                             seed=1, output_type="np")  # fmt: skip

    result = {"load_s": load_s, **settle(generate, args.runs, args.min_warmup, args.max_warmup, lambda: None)}
    image = np.asarray(generate()[0], dtype=np.float32)
    result["image_finite"] = bool(np.isfinite(image).all())
    if model == "sd1":
        rng = np.random.default_rng(0)
        result["vae"] = {}
        for px in args.vae_sizes:
            latents = rng.standard_normal((1, 4, px // 8, px // 8)).astype(np.float32)
            result["vae"][str(px)] = settle(lambda lat=latents: pipe.decode(lat), args.runs, args.min_warmup,
                                            args.max_warmup, lambda: None)  # fmt: skip
    return result


def sdcpp_worker(path: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    try:
        from stable_diffusion_cpp import StableDiffusion
    except ImportError:
        return {"skipped": "stable-diffusion-cpp-python is not installed (CMAKE_ARGS=\"-DSD_CUDA=ON\" pip install "
                           "stable_diffusion_cpp_python-*.tar.gz builds it for CUDA)"}  # fmt: skip
    start = time.perf_counter()
    sd = StableDiffusion(model_path=path, vae_decode_only=True, wtype="default", verbose=False)
    load_s = time.perf_counter() - start

    def generate() -> Any:
        return sd.generate_image(prompt=PROMPT, width=size, height=size, cfg_scale=CFG, sample_method="euler",
                                 sample_steps=args.steps, seed=1)  # fmt: skip

    return {"load_s": load_s, **settle(generate, args.runs, args.min_warmup, args.max_warmup, lambda: None)}


def ggml_devices() -> list[str]:
    """The devices the loaded ggml build lists (cpu, cuda:0, vulkan:0...)."""
    import sdkit

    return [str(d) for d in sdkit.selection.get_backend("ggml").devices()]


def run_worker(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    engine = spec["engine"]
    if engine == "devices":
        return {"devices": ggml_devices()}
    if engine.startswith("torch-"):
        return torch_worker(spec["model"], args.tiny, engine.split("-")[1], args)
    if engine == "sdcpp":
        return sdcpp_worker(spec["path"], args.size or FULL[spec["model"]][1], args)
    _, device, precision = engine.split("-")
    return sdkit_worker(spec["model"], spec["path"], device, precision, args)


# --- the run -----------------------------------------------------------------------------------


def spawn(spec: dict[str, Any], argv: list[str], timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """One engine in a process of its own: its last JSON line, or why there is none."""
    command = [python, __file__, *argv, "--worker", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit {done.returncode}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version()}
    try:
        from sdkit.cpu_features import cpu_info

        info["cpu"] = cpu_info().name
    except ImportError:
        info["cpu"] = platform.processor()
    query = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    info["gpus"] = [dict(zip(("name", "driver", "compute_cap", "memory"), (p.strip() for p in line.split(",")),
                             strict=False)) for line in out.splitlines()]  # fmt: skip
    return info


def engines_for(model: str, devices: list[str], args: argparse.Namespace) -> list[str]:
    wanted = args.engines.split(",") if args.engines else None
    gpus = [d for d in devices if d != "cpu"] or (["cpu"] if args.tiny else [])
    found = ["torch-fp16", "torch-fp32"] + [f"sdkit-{d}-{p}" for d in gpus for p in ("fp32", "fp16")]
    found += [e for e in wanted or [] if e.startswith("sdkit-") and e not in found]  # named: e.g. sdkit-cpu-fp32
    if not args.tiny:
        found.append("sdcpp")
    return [e for e in found if wanted is None or e in wanted]


def model_path(model: str, args: argparse.Namespace) -> str:
    if args.tiny:
        return str(TINY[model][0])
    import random_checkpoint

    family = FULL[model][0]
    path = Path(args.scratch) / f"{family}_random_fp16_{random_checkpoint.FORMAT}.safetensors"
    return str(random_checkpoint.write(family, path))


def print_rows(model: str, rows: list[dict[str, Any]]) -> None:
    peer = next((r for r in rows if r["engine"] == "torch-fp16" and "median_s" in r), None)
    print(f"\n## {model}: whole image, {rows[0].get('size')} px, {rows[0].get('steps')} Euler steps, CFG {CFG}")
    print("| engine | median s | steps/s | x torch-fp16 | first call s | load s | warm-up runs |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "median_s" not in row:
            print(f"| {row['engine']} | {row.get('error') or row.get('skipped')} |")
            continue
        ratio = row["median_s"] / peer["median_s"] if peer else float("nan")
        row["x_torch_fp16"] = ratio
        print(f"| {row['engine']} | {row['median_s']:.3f} | {row['steps'] / row['median_s']:.1f} | {ratio:.2f} | "
              f"{row['first_s']:.2f} | {row['load_s']:.1f} | {len(row['warmup_s'])} |", flush=True)  # fmt: skip
    for row in rows:
        for px, vae in row.get("vae", {}).items():
            median, first = vae["median_s"] * 1e3, vae["first_s"]
            print(f"VAE decode {px} px, {row['engine']}: median {median:.1f} ms (first {first:.2f} s)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="the tiny fixture pipelines on the CPU (a dry run)")
    parser.add_argument("--models", default="sd1,sdxl")
    parser.add_argument("--engines", default="", help="comma list (default: every row that applies)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--size", type=int, default=0, help="image side (default 512 for sd1, 1024 for sdxl)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--min-warmup", type=int, default=2)
    parser.add_argument("--max-warmup", type=int, default=6)
    parser.add_argument("--vae-sizes", default="512,1024")
    parser.add_argument("--threads", type=int, default=0, help="ggml CPU threads (default: ggml's; --tiny: 1)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--scratch", default=os.environ.get("SDKIT_BENCH_SCRATCH", "/tmp/sdkit-bench"))
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_whole_image.json"))
    parser.add_argument("--torch-python", default="", help="the interpreter of the PyTorch rows (default: this one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.vae_sizes = [int(s) for s in args.vae_sizes.split(",") if s]
    if args.tiny and args.vae_sizes == [512, 1024]:
        args.vae_sizes = [64, 128]
    if args.tiny and not args.threads:
        args.threads = 1  # a shared CPU: spinning worker threads cost far more than they give at 64 px
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker), args)), flush=True)
        return 0
    passed = list(argv if argv is not None else sys.argv[1:])
    report: dict[str, Any] = {"machine": machine(), "tiny": args.tiny, "steps": args.steps, "cfg": CFG, "rows": []}
    listed = spawn({"engine": "devices"}, passed, args.timeout)
    report["ggml_devices"] = listed.get("devices", listed)
    print(f"# {report['machine']['gpus'] or 'no NVIDIA GPU'}; ggml devices: {report['ggml_devices']}")
    for model in args.models.split(","):
        path = model_path(model, args)
        rows = []
        for engine in engines_for(model, listed.get("devices", []), args):
            python = args.torch_python if engine.startswith("torch-") and args.torch_python else sys.executable
            measured = spawn({"engine": engine, "model": model, "path": path}, passed, args.timeout, python)
            size = args.size or (TINY if args.tiny else FULL)[model][1]
            rows.append({"model": model, "engine": engine, "size": size, "steps": args.steps, **measured})
        print_rows(model, rows)
        report["rows"].extend(rows)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))  # after each model: a timeout keeps the rest
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
