"""The families sdkit ships: SD 1.x, SD 1.x inpainting, SD 2.x (512 epsilon, 768 v-prediction),
SDXL base, SDXL inpainting and the SDXL refiner, registered by core's built-in plugin through
``sdkit_register_model_families`` (by ``"sdkit.families.builtin:SD1"`` reference).

Their numbers are the published diffusers configs (``config.json`` of each repository's ``unet/``,
``vae/``, ``text_encoder*/`` and ``scheduler/``), the same ones the shipped graphs were exported
from (``fixtures/families/configs.py``). A single file carries no scheduler config: each family
keeps its repository's ``scheduler_config.json`` as published (keys it lacks take each sampler's
diffusers default, ``from_config`` semantics), so a file and its diffusers folder give the same
image.
"""

from __future__ import annotations

from typing import Any

from sdkit.families.clip_tokenizer import CLIP_VOCAB, OPENCLIP_VOCAB
from sdkit.families.family import PENULTIMATE, FolderSpec
from sdkit.families.stable_diffusion import TextEncoderArch, sd_family

# Pipeline classes for the families beyond SD 1.x/2.x. One class per architecture: the config
# switches the variants (a refiner's aesthetic time ids; an inpainting UNet's 9-channel sample,
# PipelineConfig.inpainting, which also makes the pipeline require an init image and a mask).
# SD 1.x inpainting runs on sd_family's default, StableDiffusionPipeline.
SDXL_PIPELINE = "sdkit.pipelines.models.sdxl:StableDiffusionXLPipeline"
SDXL_REFINER_PIPELINE = SDXL_PIPELINE
SDXL_INPAINT_PIPELINE = SDXL_PIPELINE  # its 9-channel UNet graph is not shipped yet: refused at load

# --- scheduler_config.json as each repository publishes it -------------------------------------

_SD_BETAS: dict[str, Any] = {
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
}
SD15_SCHEDULER = {"_class_name": "PNDMScheduler", **_SD_BETAS}  # runwayml/stable-diffusion-v1-5
SD15_INPAINT_SCHEDULER = {"_class_name": "DDIMScheduler", **_SD_BETAS}  # runwayml/stable-diffusion-inpainting
SD2_BASE_SCHEDULER = {"_class_name": "PNDMScheduler", **_SD_BETAS, "prediction_type": "epsilon"}  # -2-base
SD21_SCHEDULER = {"_class_name": "DDIMScheduler", **_SD_BETAS, "prediction_type": "v_prediction"}  # -2-1 (768)
SDXL_SCHEDULER = {  # stabilityai/stable-diffusion-xl-base-1.0 (the refiner's is the same)
    "_class_name": "EulerDiscreteScheduler",
    **_SD_BETAS,
    "interpolation_type": "linear",
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "timestep_spacing": "leading",
    "use_karras_sigmas": False,
}

# --- architectures (diffusers config.json numbers) ---------------------------------------------

SD1_UNET: dict[str, Any] = {
    "sample_size": 64,
    "in_channels": 4,
    "block_out_channels": [320, 640, 1280, 1280],
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "layers_per_block": 2,
    "cross_attention_dim": 768,
}
SD1_INPAINT_UNET = {**SD1_UNET, "in_channels": 9}
SD2_UNET: dict[str, Any] = {**SD1_UNET, "cross_attention_dim": 1024, "use_linear_projection": True}
SD2V_UNET: dict[str, Any] = {**SD2_UNET, "sample_size": 96}
SDXL_UNET: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "block_out_channels": [320, 640, 1280],
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "layers_per_block": 2,
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "projection_class_embeddings_input_dim": 2816,
}
SDXL_INPAINT_UNET = {**SDXL_UNET, "in_channels": 9}
SDXL_REFINER_UNET: dict[str, Any] = {
    **SDXL_UNET,
    "block_out_channels": [384, 768, 1536, 1536],
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "cross_attention_dim": 1280,
    "projection_class_embeddings_input_dim": 2560,
}
SD_VAE: dict[str, Any] = {"block_out_channels": [128, 256, 512, 512], "latent_channels": 4, "scaling_factor": 0.18215}
SDXL_VAE: dict[str, Any] = {**SD_VAE, "scaling_factor": 0.13025}

CLIP_L = TextEncoderArch("text_encoder", "clip_l", "clip", "cond_stage_model.transformer.", 768, 12)
OPENCLIP_H = TextEncoderArch("text_encoder", "openclip_h", "openclip", "cond_stage_model.model.", 1024, 23)
SDXL_CLIP_L = TextEncoderArch("text_encoder", "clip_l", "clip", "conditioner.embedders.0.transformer.", 768, 12)
SDXL_BIGG = TextEncoderArch(
    "text_encoder_2", "openclip_bigg", "openclip", "conditioner.embedders.1.model.", 1280, 32, projection_dim=1280
)
REFINER_BIGG = TextEncoderArch(
    "text_encoder_2", "openclip_bigg", "openclip", "conditioner.embedders.0.model.", 1280, 32, projection_dim=1280
)

SD_OUTPUTS = {"text_encoder": ("last_hidden_state",)}
# SDXL reads each encoder's penultimate layer, and bigG's pooled projection.
SDXL_OUTPUTS = {"text_encoder": ("hidden_states.11",), "text_encoder_2": ("hidden_states.31", "text_embeds")}
REFINER_OUTPUTS = {"text_encoder_2": ("hidden_states.31", "text_embeds")}

# --- their diffusers/optimum ONNX folders (Family.folder) -------------------------------------

# Architectures a folder may name that sdkit runs none of: SD's fallback spec claims their folders
# and refuses them by name (rather than as a folder missing unet/model.onnx).
OTHER_ARCHITECTURES = ("Kandinsky", "Cascade", "Kontext", "Fill")
# SD 1.x/2.x (txt2img, inpainting, ControlNet): any folder no other family claims; each folder's
# config files say which SD it is (read as sd1, whose defaults are diffusers' AutoencoderKL's).
SD_FOLDER = FolderSpec(
    required=("text_encoder", "unet", "vae_decoder"),
    optional=("vae_encoder", "unet_controlnet"),
    tokenizers={"text_encoder": "tokenizer"},
    text_outputs=SD_OUTPUTS,
    refused=OTHER_ARCHITECTURES,
)
# SDXL base, refiner (no text_encoder), inpainting, ControlNet: an XL class or a text_encoder_2.
SDXL_FOLDER = FolderSpec(
    required=("text_encoder_2", "unet", "vae_decoder"),
    optional=("text_encoder", "vae_encoder", "unet_controlnet"),
    tokenizers={"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"},
    text_outputs={"text_encoder": (PENULTIMATE,), "text_encoder_2": (PENULTIMATE, "text_embeds")},
    class_names=("XL",),
    markers=("text_encoder_2",),
    rank=10,
    refused=OTHER_ARCHITECTURES,
    listed_required=("text_encoder",),
    time_ids=True,
)

# --- the families ------------------------------------------------------------------------------

SD1 = sd_family(
    "sd1",
    "SD 1.x",
    unet_graph="sd1_unet",
    unet_config=SD1_UNET,
    text_encoders=(CLIP_L,),
    vae_config=SD_VAE,
    scheduler_config=SD15_SCHEDULER,
    tokenizers={"text_encoder": CLIP_VOCAB},
    text_outputs=SD_OUTPUTS,
    folder=SD_FOLDER,
)
SD1_INPAINT = sd_family(
    "sd1_inpaint",
    "SD 1.x inpainting",
    unet_graph="sd1_inpaint_unet",
    unet_config=SD1_INPAINT_UNET,
    text_encoders=(CLIP_L,),
    vae_config=SD_VAE,
    scheduler_config=SD15_INPAINT_SCHEDULER,
    tokenizers={"text_encoder": CLIP_VOCAB},
    text_outputs=SD_OUTPUTS,
)
SD2 = sd_family(
    "sd2",
    "SD 2.x (512, epsilon)",
    unet_graph="sd2_unet",
    unet_config=SD2_UNET,
    text_encoders=(OPENCLIP_H,),
    vae_config=SD_VAE,
    scheduler_config=SD2_BASE_SCHEDULER,
    tokenizers={"text_encoder": OPENCLIP_VOCAB},
    text_outputs=SD_OUTPUTS,
)
# The same files as SD2: the A1111 .yaml or prediction="v"/"epsilon" tells them apart; without
# either, a SD 2.x file is read as 768-v, as diffusers' from_single_file reads it (SD 2.1's config).
SD2V = sd_family(
    "sd2v",
    "SD 2.x (768, v-prediction)",
    unet_graph="sd2_unet",
    unet_config=SD2V_UNET,
    text_encoders=(OPENCLIP_H,),
    vae_config=SD_VAE,
    scheduler_config=SD21_SCHEDULER,
    tokenizers={"text_encoder": OPENCLIP_VOCAB},
    text_outputs=SD_OUTPUTS,
    prediction_type="v_prediction",
    priority=1,
)
SDXL = sd_family(
    "sdxl",
    "SDXL base",
    unet_graph="sdxl_unet",
    unet_config=SDXL_UNET,
    text_encoders=(SDXL_CLIP_L, SDXL_BIGG),
    vae_config=SDXL_VAE,
    scheduler_config=SDXL_SCHEDULER,
    tokenizers={"text_encoder": CLIP_VOCAB, "text_encoder_2": OPENCLIP_VOCAB},
    text_outputs=SDXL_OUTPUTS,
    pipeline=SDXL_PIPELINE,
    xl=True,
    folder=SDXL_FOLDER,
)
SDXL_INPAINT = sd_family(
    "sdxl_inpaint",
    "SDXL inpainting",
    unet_graph="sdxl_inpaint_unet",
    unet_config=SDXL_INPAINT_UNET,
    text_encoders=(SDXL_CLIP_L, SDXL_BIGG),
    vae_config=SDXL_VAE,
    scheduler_config=SDXL_SCHEDULER,
    tokenizers={"text_encoder": CLIP_VOCAB, "text_encoder_2": OPENCLIP_VOCAB},
    text_outputs=SDXL_OUTPUTS,
    pipeline=SDXL_INPAINT_PIPELINE,
    xl=True,
)
SDXL_REFINER = sd_family(
    "sdxl_refiner",
    "SDXL refiner",
    unet_graph="sdxl_refiner_unet",
    unet_config=SDXL_REFINER_UNET,
    text_encoders=(REFINER_BIGG,),
    vae_config=SDXL_VAE,
    scheduler_config=SDXL_SCHEDULER,
    tokenizers={"text_encoder_2": OPENCLIP_VOCAB},
    text_outputs=REFINER_OUTPUTS,
    pipeline=SDXL_REFINER_PIPELINE,
    xl=True,
)

FAMILIES = (SD1, SD1_INPAINT, SD2, SD2V, SDXL, SDXL_INPAINT, SDXL_REFINER)
