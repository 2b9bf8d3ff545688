"""No drift for a ControlNet: one ``control`` unit through the plugin equals calling
stable-diffusion.cpp-python directly with ``control_net_path``, ``control_image`` and
``control_strength``, pixel for pixel. A full-size random SD 1.5 ControlNet (723 MB, written once
per checkout) on the full-size random SD 1.5 file (``-m slow``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sdcpp_checkpoints import cached_checkpoint
from sdcpp_helpers import needs_binding

import sdkit
from sdkit_sdcpp import binding

pytestmark = [needs_binding, pytest.mark.slow]
THREADS = 2


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_controlnet_unit_equals_the_binding(sd15: Path, request: pytest.FixtureRequest) -> None:
    net = cached_checkpoint(request, "sd15_controlnet")
    hint = np.zeros((64, 64, 3), np.uint8)
    hint[16:48, 16:48] = 255  # a white square: an edge map's shape
    common = {"seed": 4, "steps": 2, "width": 64, "height": 64, "sampler": "euler"}
    with sdkit.load_pipeline(sd15, backend="sdcpp", threads=THREADS, controlnets=net) as pipe:
        assert pipe.controlnet == "sd15_controlnet-random-fp16"
        [plain] = pipe.generate("a house", **common)
        [ours] = pipe.generate("a house", control=[(hint, None, 0.8)], **common)
    binding.import_binding()
    from stable_diffusion_cpp import StableDiffusion

    model = StableDiffusion(
        model_path=str(sd15), control_net_path=str(net), n_threads=THREADS, vae_decode_only=False,
        lora_apply_mode="at_runtime", verbose=False,
    )  # fmt: skip
    try:
        [theirs] = model.generate_image(
            prompt="a house", seed=4, sample_steps=2, width=64, height=64, sample_method="euler", cfg_scale=7.5,
            control_image=Image.fromarray(hint), control_strength=0.8,
        )  # fmt: skip
    finally:
        model.close()
    assert np.array_equal(_pixels(ours), _pixels(theirs))
    assert not np.array_equal(_pixels(ours), _pixels(plain))  # the ControlNet acted, it was not dropped
