"""Round-trip a real photo through the real TAEF2
autoencoder on the best backend this machine has, and write the PNG.

    python examples/taef2_roundtrip.py [--backend auto] [--out out/dog_roundtrip.png]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from PIL import Image

import sdkit

MODELS = Path(__file__).resolve().parents[1] / "models" / "taef2"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--image", default=str(MODELS / "dog.png"))
    parser.add_argument("--out", default="out/dog_roundtrip.png")
    args = parser.parse_args()

    photo = np.asarray(Image.open(args.image).convert("RGB"), dtype=np.float32) / 255.0
    height, width = (photo.shape[0] // 8) * 8, (photo.shape[1] // 8) * 8
    pixels = np.ascontiguousarray(photo[:height, :width].transpose(2, 0, 1)[None])

    start = time.perf_counter()
    encoder = sdkit.compile(MODELS / "taef2_encoder.onnx", backend=args.backend, input_shapes={"image": pixels.shape})
    latent_shape = (1, 32, height // 8, width // 8)
    decoder = sdkit.compile(MODELS / "taef2_decoder.onnx", backend=args.backend, input_shapes={"latent": latent_shape})
    compiled_s = time.perf_counter() - start

    start = time.perf_counter()
    latent = encoder.run({"image": pixels})["latent"]
    decoded = np.clip(decoder.run({"latent": latent})["image"], 0.0, 1.0)
    run_s = time.perf_counter() - start

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((decoded[0].transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8)).save(out)
    print(f"backend: {encoder.backend_name} on {encoder.device}")
    print(f"compile {compiled_s:.2f} s, encode+decode {run_s:.2f} s at {width}x{height}")
    print(f"round-trip PSNR {psnr(decoded[0], pixels[0]):.2f} dB (PyTorch: 31.87 dB)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
