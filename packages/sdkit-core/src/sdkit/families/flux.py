"""FLUX.1 dev and schnell single files as families (``flux_family``): BFL's transformer file
plus CLIP-L, T5-XXL and VAE files.

The files users have (``flux1-dev.safetensors``, ``flux1-schnell.safetensors``, ComfyUI's
copies under ``model.diffusion_model.``, ``flux1-dev-fp8``) hold the transformer only, in BFL's
key layout (``sdkit.families.flux_keys``); the other components come from their own files, as
stable-diffusion.cpp's ``--clip_l``, ``--t5xxl``, ``--vae`` take them (``Family.files``: ComfyUI's
``clip_l.safetensors`` and ``t5xxl_fp16.safetensors`` in transformers' names, BFL's
``ae.safetensors`` in the LDM VAE names), read under ``clip_l.``, ``t5xxl.`` and ``vae.``; the
VAE file gives both the decoder and the encoder (img2img: ``flow_vae_components``, which SD3's and
Chroma's families share); a decoder-only VAE file loads without the encoder, and img2img is then
one error naming the encoder keys it lacks.
Detection looks at the transformer only and tells dev from schnell by the guidance embedder
(``guidance_in``: dev's distilled guidance input; schnell has none): both families' probes match
a dev file, and dev's higher ``priority`` wins.

The published numbers (diffusers' ``FluxTransformer2DModel`` config of FLUX.1-dev/-schnell):
width 3072 (24 heads of 128), 64 input channels (16-channel latents packed 2x2), T5-XXL context
4096, CLIP-L pooled 768, timestep and guidance embedded from 256 sinusoidal channels, 19 double
and 38 single blocks, MLP ratio 4; the VAE's scaling 0.3611 and shift 0.1159.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.families.clip_tokenizer import CLIP_VOCAB, TokenizerSource
from sdkit.families.family import Family, FamilyComponent, FolderSpec
from sdkit.families.flux_keys import BflFlux
from sdkit.families.keymaps import LdmClip, LdmVae, TensorSource

FLUX_LAYOUT = "bfl"
TIME_CHANNELS = 256  # the sinusoidal embedding width of timestep and guidance
# The families' pipeline, on the shipped full-size graphs (``flux_dev_transformer``,
# ``flux_schnell_transformer``, ``clip_l``, ``t5xxl_encoder``, ``flux_vae_decoder``,
# ``flux_vae_encoder``).
FLUX_SINGLE_FILE_PIPELINE = "sdkit.pipelines.models.flux:FluxPipeline"
# black-forest-labs/FLUX.1-dev and -schnell scheduler/scheduler_config.json as published.
FLUX_DEV_SCHEDULER: dict[str, Any] = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
FLUX_SCHNELL_SCHEDULER: dict[str, Any] = {**FLUX_DEV_SCHEDULER, "shift": 1.0, "use_dynamic_shifting": False}


@dataclass(frozen=True)
class FluxArch:
    """The numbers of a Flux transformer that its key layout and probes depend on."""

    hidden: int = 3072
    in_channels: int = 64
    context_dim: int = 4096  # T5-XXL
    pooled_dim: int = 768  # CLIP-L
    double_blocks: int = 19
    single_blocks: int = 38
    mlp_ratio: int = 4

    def probes(self, guidance: bool) -> dict[str, tuple[int, ...]]:
        """Graph initializers and shapes a file of this architecture has (dev: with guidance)."""
        h = self.hidden
        found: dict[str, tuple[int, ...]] = {
            "x_embedder.weight": (h, self.in_channels),
            "context_embedder.weight": (h, self.context_dim),
            "time_text_embed.timestep_embedder.linear_1.weight": (h, TIME_CHANNELS),
            "time_text_embed.text_embedder.linear_1.weight": (h, self.pooled_dim),
            "transformer_blocks.0.attn.to_q.weight": (h, h),
            "single_transformer_blocks.0.proj_mlp.weight": (self.mlp_ratio * h, h),
            "norm_out.linear.weight": (2 * h, h),
        }
        if guidance:
            found["time_text_embed.guidance_embedder.linear_1.weight"] = (h, TIME_CHANNELS)
        return found


@dataclass(frozen=True)
class FluxGraphs:
    """The family's weightless graphs (shipped names or ``.onnx`` paths) and the VAE's depth."""

    transformer: str | Path
    clip: str | Path = "clip_l"
    t5: str | Path = "t5xxl_encoder"
    vae_decoder: str | Path = "flux_vae_decoder"
    vae_blocks: int = 4  # the VAE's down (= up) blocks: 8 pixels per latent cell
    vae_encoder: str | Path = "flux_vae_encoder"  # img2img's encoder, from the same VAE file (optional)


@dataclass(frozen=True)
class T5File:
    """T5's encoder as ComfyUI's ``t5xxl_fp16.safetensors`` stores it: transformers'
    ``T5EncoderModel`` names under ``prefix``; the tied embedding is ``shared.weight``, some files
    repeat it as ``encoder.embed_tokens.weight``."""

    prefix: str = "t5xxl."

    def source(self, name: str, shape: Sequence[int]) -> TensorSource:
        if name in _T5_EMBEDDING:
            return TensorSource(tuple(self.prefix + n for n in (name, *(n for n in _T5_EMBEDDING if n != name))))
        return TensorSource((self.prefix + name,))

    def ignored(self, key: str) -> bool:
        return key.removeprefix(self.prefix) in _T5_EMBEDDING  # the tied copy not read


_T5_EMBEDDING = ("shared.weight", "encoder.embed_tokens.weight")


def flow_vae_components(
    decoder: str | Path, encoder: str | Path, blocks: int, layout: str, prefix: str
) -> dict[str, FamilyComponent]:
    """The 16-channel VAE of FLUX.1, SD3 / SD 3.5 and Chroma (one architecture: no quant convs;
    the shipped ``flux_vae_decoder`` / ``flux_vae_encoder`` graphs): both halves in LDM names under
    ``prefix`` (BFL's ``ae.safetensors`` as ``vae.``, Stability's ``first_stage_model.``). The
    encoder is img2img's only, so it is ``optional``: a decoder-only VAE file leaves it out (txt2img
    runs; img2img is refused naming the keys it lacks), a partial one is refused."""
    mapper = LdmVae(blocks, prefix)
    return {
        "vae_decoder": FamilyComponent(decoder, {layout: mapper}),
        "vae_encoder": FamilyComponent(encoder, {layout: mapper}, optional=True),
    }


COMPONENT_FILES = {
    "clip_l": "CLIP-L text encoder, e.g. ComfyUI's clip_l.safetensors",
    "t5xxl": "T5-XXL text encoder, e.g. t5xxl_fp16.safetensors",
    "vae": "the Flux VAE, e.g. BFL's ae.safetensors",
}


def flux_family(
    name: str,
    label: str,
    graphs: FluxGraphs,
    arch: FluxArch,
    guidance: bool,
    pipeline: str = FLUX_SINGLE_FILE_PIPELINE,
    clip_tokenizer: TokenizerSource = CLIP_VOCAB,
    folder: FolderSpec | None = None,
) -> Family:
    """A Flux family: the transformer from a BFL-layout file, CLIP-L, T5 and the VAE from their
    own files (``Family.files``), the published FLUX.1 configuration."""
    components = {
        "text_encoder": FamilyComponent(graphs.clip, {FLUX_LAYOUT: LdmClip("clip_l.")}),
        "text_encoder_2": FamilyComponent(graphs.t5, {FLUX_LAYOUT: T5File()}),
        "transformer": FamilyComponent(
            graphs.transformer, {FLUX_LAYOUT: BflFlux(arch.hidden)}, probes=arch.probes(guidance)
        ),
        **flow_vae_components(graphs.vae_decoder, graphs.vae_encoder, graphs.vae_blocks, FLUX_LAYOUT, "vae."),
    }
    scheduler = FLUX_DEV_SCHEDULER if guidance else FLUX_SCHNELL_SCHEDULER
    return Family(
        name=name,
        label=label,
        pipeline=pipeline,
        components=components,
        prediction_type="flow",
        scheduler_config=scheduler,
        tokenizers={"text_encoder": clip_tokenizer},
        text_outputs={"text_encoder": ("pooler_output",), "text_encoder_2": ("last_hidden_state",)},
        sample_size=128,
        latent_channels=16,
        vae_scaling_factor=0.3611,
        vae_scale_factor=2 ** (graphs.vae_blocks - 1),
        fp32_components=("vae_decoder", "vae_encoder"),
        priority=1 if guidance else 0,
        files=COMPONENT_FILES,
        config={"vae_shift_factor": 0.1159, "patch_size": 2, "denoiser_config": {"guidance_embeds": guidance}},
        folder=folder,
    )


# A flow family's folder: a class name it claims but does not run (a variant pipeline).
FLOW_VARIANTS = ("Control", "Inpaint", "Img2Img", "Kontext", "Fill")
# FLUX.1 dev's and schnell's diffusers ONNX folders (both read as flux_dev: everything that tells
# them apart, the scheduler and the transformer's guidance_embeds, is the folder's own).
FLUX_FOLDER = FolderSpec(
    required=("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
    optional=("vae_encoder",),
    tokenizers={"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"},
    text_outputs={"text_encoder": ("pooler_output",), "text_encoder_2": ("last_hidden_state",)},
    class_names=("Flux",),
    rank=20,
    refused=FLOW_VARIANTS,
    shipped_vocab=("text_encoder_2",),
    denoiser="transformer",
    denoiser_keys=(),  # the transformer's patch_size is 1: the 2x2 packing is the pipeline's
)
FLUX = FluxArch()
FLUX_DEV = flux_family(
    "flux_dev", "FLUX.1 dev", FluxGraphs("flux_dev_transformer"), FLUX, guidance=True, folder=FLUX_FOLDER
)
FLUX_SCHNELL = flux_family(
    "flux_schnell", "FLUX.1 schnell", FluxGraphs("flux_schnell_transformer"), FLUX, guidance=False
)
