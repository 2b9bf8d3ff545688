"""The benchmark cases: which model, which inputs. Shared by run.py and worker.py.

The SD graphs are the real architectures with seeded random weights (``fixtures/sd_graphs.py``);
the VAE latents are stable-diffusion.cpp's own ``rng_type="cpu"`` noise for seed 42
(``fixtures/sd_checkpoint.sdcpp_cpu_randn``), so sd.cpp's decode of that noise can be compared
with onnxruntime's on the same latent.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))  # fixtures/ is not an installed package

import sd_checkpoint  # noqa: E402
import sd_graphs  # noqa: E402

NOISE_SEED = 42


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    graph: str  # sd_graphs name, or "taef2_decoder"
    latent: int = 0  # latent side for the VAE cases


CASES: dict[str, Case] = {
    "vae256": Case("vae256", "SD 1.5 VAE decoder, latent 1x4x32x32 -> 256 px", "sd15_vae_decoder", 32),
    "vae512": Case("vae512", "SD 1.5 VAE decoder, latent 1x4x64x64 -> 512 px", "sd15_vae_decoder", 64),
    "unet512": Case("unet512", "SD 1.5 UNet, one step, latent 1x4x64x64 (512 px), batch 1", "sd15_unet", 64),
    "unet256": Case("unet256", "SD 1.5 UNet, one step, latent 1x4x32x32 (256 px), batch 1", "sd15_unet", 32),
    "taef2": Case("taef2", "TAEF2 decoder (real weights), latent 1x32x64x64 -> 512 px", "taef2_decoder"),
}


def taef2_path() -> Path:
    for folder in (ROOT / "models" / "taef2", ROOT.parent / "shared" / "models" / "taef2"):
        if (folder / "taef2_decoder.onnx").is_file():
            return folder / "taef2_decoder.onnx"
    raise FileNotFoundError("taef2_decoder.onnx not found (models/taef2 or ../shared/models/taef2)")


def model_path(case: Case) -> Path:
    if case.graph == "taef2_decoder":
        return taef2_path()
    return Path(sd_graphs.model_path(case.graph))


def feeds(case: Case) -> dict[str, np.ndarray]:
    if case.graph == "sd15_vae_decoder":
        return {"latent_sample": sd_checkpoint.sdcpp_cpu_randn(NOISE_SEED, (1, 4, case.latent, case.latent))}
    if case.graph == "sd15_unet":
        return sd_graphs.example_inputs("sd15_unet", "bench" if case.latent == 64 else "small")
    if case.graph == "taef2_decoder":
        latent = np.random.default_rng(0).standard_normal((1, 32, 64, 64)).astype(np.float32)
        return {"latent": latent}
    raise KeyError(case.graph)
