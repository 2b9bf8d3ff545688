"""``tiny_digits``: Stable Diffusion's architecture at small size, trained on scikit-learn's digits.

The model the repository ships as ``models/tiny-digits/tiny_digits.safetensors`` (its model card
is that folder's README.md): a CLIP text encoder (2 layers, width 32, the full CLIP BPE
vocabulary and sdkit's shipped tokenizer), a UNet2DCondition denoiser (2 levels, 32/64 channels,
cross-attention in both) and an AutoencoderKL (3 blocks: a 32 px image is an 8x8x4 latent),
trained from scratch by ``tools/train_tiny_digits.py`` on the 1,797 8x8 images of
``sklearn.datasets.load_digits`` with prompts such as "a handwritten digit seven". It is an SD
1.x-style family in every respect but size: the same pipeline, samplers, epsilon prediction on
SD's scaled-linear betas, the LDM single-file key layout (``model.diffusion_model.``,
``first_stage_model.``, ``cond_stage_model.transformer.``), so the file loads like any civitai
SD 1.x checkpoint. Its own weightless graphs ship in ``graphs/`` (``tiny_digits_*.onnx.gz``,
exported by ``fixtures/families/export_graphs.py`` from ``fixtures/families/configs.py``'s
``TINY_DIGITS_*``); detection tells it from SD 1.x by its tensors' shapes.

The numbers below are those configs; ``scaling_factor`` is the one training measured (1 / the
standard deviation of the VAE's latents over the data set), recorded in the model card.
"""

from __future__ import annotations

from typing import Any

from sdkit.families.builtin import SD15_INPAINT_SCHEDULER, SD_OUTPUTS
from sdkit.families.clip_tokenizer import CLIP_VOCAB
from sdkit.families.stable_diffusion import TextEncoderArch, sd_family

TINY_DIGITS_UNET: dict[str, Any] = {
    "sample_size": 8,
    "in_channels": 4,
    "block_out_channels": [32, 64],
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "layers_per_block": 1,
    "cross_attention_dim": 32,
}
TINY_DIGITS_VAE: dict[str, Any] = {"block_out_channels": [16, 32, 32], "latent_channels": 4, "scaling_factor": 0.7915}
TINY_DIGITS_CLIP = TextEncoderArch(
    "text_encoder", "tiny_digits_clip", "clip", "cond_stage_model.transformer.", hidden_size=32, layers=2
)

TINY_DIGITS = sd_family(
    "tiny_digits",
    "tiny digits (SD architecture trained on scikit-learn's digits)",
    unet_graph="tiny_digits_unet",
    unet_config=TINY_DIGITS_UNET,
    text_encoders=(TINY_DIGITS_CLIP,),
    vae_config=TINY_DIGITS_VAE,
    scheduler_config=SD15_INPAINT_SCHEDULER,  # DDIM on SD's betas, as the model was trained
    tokenizers={"text_encoder": CLIP_VOCAB},
    text_outputs=SD_OUTPUTS,
    vae_graphs=("tiny_digits_vae_encoder", "tiny_digits_vae_decoder"),
)
