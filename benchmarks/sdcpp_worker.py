"""stable-diffusion.cpp (through stable-diffusion-cpp-python) in a process of its own.

sd.cpp reads checkpoints, not ONNX graphs, and its Python binding has no "decode this latent"
or "run one UNet step" call: everything goes through ``generate_image``. Its own log times
each stage (``ggml_time_ms``, printed with 10 ms resolution), and this worker reads them:

- ``vae256``: the verification checkpoint (``fixtures/sd_checkpoint.py``, ``zero_unet=True``:
  the fixture VAE, a zero UNet), 256x256, Euler, one step from custom sigmas ``[0.18215, 0]``,
  cfg 1, ``rng_type="cpu"`` seed 42. A zero UNet predicts eps = 0, so sd.cpp decodes exactly
  its seed-42 noise, the latent every engine gets in cases.py: the image is compared with
  onnxruntime's decode. Time = the log's "latent 1 decoded, taking X s".
- ``unet512`` and ``vae512``: the full checkpoint (the fixture UNet and VAE, a random CLIP-L),
  512x512, Euler, one step, cfg 1 (one UNet evaluation): "sampling completed, taking X s" is
  the UNet step (sd.cpp builds and allocates its graph inside that time, as it does every
  step), "latent 1 decoded" the VAE decode at 512 px. One process gives both.
- ``txt2img``: the full checkpoint, 512x512, ``--steps`` Euler steps, cfg 7, and every stage
  the log times (text conditioning, sampling, decode, generate_image in total).

Peak RSS is the whole process (sd.cpp holds the whole checkpoint, UNet included, whatever is
timed); the log's per-model buffer sizes are returned too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases

LOG: list[str] = []
_STAGES = {
    "decode": re.compile(r"latent 1 decoded, taking ([\d.]+)s"),
    "sampling": re.compile(r"sampling completed, taking ([\d.]+)s"),
    "condition": re.compile(r"get_learned_condition completed, taking ([\d.]+)s"),
    "generate": re.compile(r"generate_image completed in ([\d.]+)s"),
}
_BUFFER = re.compile(r"(\w[\w ]*?)\s+(?:params backend buffer size|compute buffer size)\s*=\s*([\d.]+) MB", re.I)


def install_log_capture() -> None:
    import stable_diffusion_cpp as sd_cpp

    @sd_cpp.sd_log_callback  # type: ignore[misc]
    def capture(level: int, text: bytes, data: ctypes.c_void_p) -> None:
        LOG.append(text.decode("utf-8", errors="replace").strip())

    install_log_capture.keep = capture  # type: ignore[attr-defined]  # the C side holds a raw pointer
    sd_cpp.sd_set_log_callback(capture, ctypes.c_void_p(0))


def stage_times(lines: list[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in lines:
        for stage, pattern in _STAGES.items():
            if m := pattern.search(line):
                found[stage] = float(m[1])
    return found


def load(checkpoint: Path, threads: int) -> object:
    from stable_diffusion_cpp import StableDiffusion

    install_log_capture()
    model = StableDiffusion(
        model_path=str(checkpoint),
        vae_decode_only=True,
        n_threads=threads,
        wtype="default",  # keep the file's f32
        rng_type="cpu",
        sampler_rng_type="cpu",
        verbose=True,
    )
    install_log_capture()  # the constructor may have set the binding's own callback again
    return model


def generate(model: object, size: int, steps: int, cfg: float, sigmas: str | None) -> tuple[dict[str, float], object]:
    LOG.clear()
    start = time.perf_counter()
    images = model.generate_image(  # type: ignore[attr-defined]
        prompt="a photo of a cat",
        width=size,
        height=size,
        cfg_scale=cfg,
        sample_method="euler",
        sample_steps=steps,
        sigmas=sigmas,
        seed=cases.NOISE_SEED,
    )
    times = stage_times(LOG)
    times["wall"] = time.perf_counter() - start
    return times, images[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True, choices=("vae256", "unet512", "txt2img"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="txt2img sampling steps")
    parser.add_argument("--outputs", required=True)
    parser.add_argument("--log", type=Path, default=None, help="write sd.cpp's whole log here")
    args = parser.parse_args()
    import sd_checkpoint

    start = time.perf_counter()
    checkpoint = sd_checkpoint.checkpoint_path(0, zero_unet=args.mode == "vae256")
    model = load(checkpoint, args.threads)
    load_s = time.perf_counter() - start
    buffers = [f"{m[1].strip()}: {m[2]} MB" for line in LOG for m in [_BUFFER.search(line)] if m]
    if args.mode == "vae256":
        size, steps, cfg, sigmas = 256, 1, 1.0, f"{sd_checkpoint.VAE_SCALE},0"
    elif args.mode == "unet512":
        size, steps, cfg, sigmas = 512, 1, 1.0, None
    else:
        size, steps, cfg, sigmas = 512, args.steps, 7.0, None
        args.warmup, args.repeat = 0, max(1, min(args.repeat, 1))
    for _ in range(args.warmup):
        generate(model, size, steps, cfg, sigmas)
    runs = []
    image = None
    everything = list(LOG)
    for _ in range(args.repeat):
        times, image = generate(model, size, steps, cfg, sigmas)
        buffers += [f"{m[1].strip()}: {m[2]} MB" for line in LOG for m in [_BUFFER.search(line)] if m]
        runs.append(times)
        everything += LOG
    if args.log:
        args.log.write_text("\n".join(everything))
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)  # type: ignore[attr-defined]
    pixels = rgb.transpose(2, 0, 1)[None] / 255.0  # 1x3xHxW in [0, 1]
    np.savez(args.outputs, image01=pixels)
    import stable_diffusion_cpp as sd_cpp

    print(json.dumps({
        "engine": "sdcpp", "mode": args.mode, "load_s": load_s, "runs": runs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "buffers": sorted(set(buffers)), "steps": steps, "cfg": cfg, "size": size,
        "system_info": sd_cpp.sd_get_system_info().decode(errors="replace").strip(),
        "version": f"{sd_cpp.sd_version().decode()} ({sd_cpp.sd_commit().decode()})",
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
