"""The documented noise stream, batches, and the keep/offload memory policies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError
from sdkit.pipelines.stages.rng import NoiseStream, seed_list

# Guidance 1 (no CFG: one UNet batch) and few steps keep these tests cheap on the reference backend.
SMALL = {"width": 32, "height": 32, "steps": 2, "sampler": "euler_a", "guidance_scale": 1.0, "output_type": "np"}


def test_noise_stream_is_pcg64_standard_normal_per_image() -> None:
    stream = NoiseStream(seed_list(7, 2))
    first, second = stream.normal((2, 4, 3, 3)), stream.normal((2, 4, 3, 3))
    for row, seed in enumerate((7, 8)):
        rng = np.random.Generator(np.random.PCG64(seed))
        np.testing.assert_array_equal(first[row], rng.standard_normal((4, 3, 3), dtype=np.float32))
        np.testing.assert_array_equal(second[row], rng.standard_normal((4, 3, 3), dtype=np.float32))
    assert first.dtype == np.float32
    with pytest.raises(InputError):
        stream.normal((3, 4, 3, 3))
    with pytest.raises(InputError):
        seed_list("1", 1)  # type: ignore[arg-type]


def test_batch_image_i_equals_seed_plus_i(reference_pipe: Any) -> None:
    batch = reference_pipe.generate("a red cat", seed=5, num_images=2, **{**SMALL, "steps": 1})
    single = reference_pipe.generate("a red cat", seed=6, **{**SMALL, "steps": 1})
    assert batch.shape == (2, 32, 32, 3)
    assert np.abs(batch[1] - single[0]).max() <= 1e-5
    assert np.abs(batch[0] - batch[1]).max() > 1e-2


def test_offload_gives_the_keep_image_and_releases(tiny_dir: Path, reference_pipe: Any) -> None:
    offload = sdkit.load_pipeline(tiny_dir, backend="reference", memory="offload")
    seen: list[tuple[int, int, tuple[int, ...]]] = []
    image = offload.generate("a dog", seed=3, callback=lambda i, n, x: seen.append((i, n, x.shape)), **SMALL)
    kept = reference_pipe.generate("a dog", seed=3, **SMALL)
    assert seen == [(0, 2, (1, 4, 16, 16)), (1, 2, (1, 4, 16, 16))]
    np.testing.assert_array_equal(image, kept)
    assert all(c._compiled is None for c in offload.components.values())
    assert offload.backends() == {
        "text_encoder": "reference",
        "unet": "reference",
        "vae_decoder": "reference",
        "vae_encoder": None,
    }


def test_pipeline_runs_without_onnxruntime_or_torch(tiny_dir: Path) -> None:
    """The pipeline runs through sdkit.compile only: no onnxruntime, torch, diffusers, transformers."""
    code = (
        "import sys, sdkit\n"
        f"p = sdkit.load_pipeline({str(tiny_dir)!r}, backend='reference')\n"
        "p.generate('a cat', seed=0, width=32, height=32, steps=1, guidance_scale=1.0)\n"
        "bad = [m for m in ('onnxruntime', 'torch', 'diffusers', 'transformers') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_init_image_of_odd_size_is_resized(reference_pipe: Any, golden: dict[str, np.ndarray]) -> None:
    """No size given: the init image's own size rounded down to a multiple of 8 (37x35 -> 32x32)."""
    from PIL import Image

    odd = Image.fromarray(golden["init_image"]).resize((37, 35))
    image = reference_pipe.generate(
        "a cat", init_image=odd, seed=0, strength=0.5, **{**SMALL, "width": None, "height": None}
    )
    assert image.shape == (1, 32, 32, 3)
