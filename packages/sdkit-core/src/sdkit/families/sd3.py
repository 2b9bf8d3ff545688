"""SD3 Medium, SD 3.5 Large and SD 3.5 Medium single files as families (``sd3_family``).

Stability's files hold the MMDiT under ``model.diffusion_model.`` (``sdkit.families.sd3_keys``)
and, depending on the release, some or all of the other components in their own namespaces:
CLIP-L and OpenCLIP bigG in transformers' names under ``text_encoders.clip_l.transformer.`` and
``text_encoders.clip_g.transformer.``, T5-XXL under ``text_encoders.t5xxl.transformer.``, the VAE
in LDM names under ``first_stage_model.`` (``sd3_medium_incl_clips_t5xxlfp16.safetensors`` has
them all, ``sd3.5_large.safetensors`` the MMDiT and the VAE). What the file lacks comes from its
own file (``Family.files``: ``--clip_l``, ``--clip_g``, ``--t5xxl``, ``--vae``, as ComfyUI and
stable-diffusion.cpp take them: ComfyUI's ``clip_l.safetensors``, ``clip_g.safetensors``,
``t5xxl_fp16.safetensors`` in transformers' names, a VAE in LDM names), read in the namespace the
file would hold it in (``Family.embedded``); a given file replaces what the checkpoint holds there.
The VAE gives the decoder and img2img's encoder (``flux.flow_vae_components``; the encoder is
optional: a decoder-only VAE runs txt2img only).

Detection looks at the MMDiT only: width (64 per head), the last block (its context side is
"pre-only": a two-part modulation, so the depth is exact), the position-embedding table
(SD3 / 3.5 Large 192 x 192 positions, 3.5 Medium 384 x 384) and 3.5 Medium's MMDiT-X second
attention (``attn2``, blocks 0-12). The published numbers (diffusers' ``SD3Transformer2DModel``
config of stabilityai/stable-diffusion-3-medium-diffusers, -3.5-large, -3.5-medium): patch 2,
16 latent channels, T5-XXL context 4096 (CLIP-L 768 + bigG 1280 zero-padded to it), pooled
768 + 1280; SD3 Medium 24 blocks of width 1536 without q/k norms; SD 3.5 Large 38 of 2432 with
RMS q/k norms; SD 3.5 Medium 24 of 1536 with RMS q/k norms and ``attn2`` in blocks 0-12. The
scheduler: FlowMatchEulerDiscreteScheduler with shift 3.0; the VAE: scaling 1.5305, shift 0.0609.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.families.clip_tokenizer import CLIP_VOCAB, OPENCLIP_VOCAB, TokenizerSource
from sdkit.families.family import PENULTIMATE, Family, FamilyComponent, FolderSpec
from sdkit.families.flux import FLOW_VARIANTS, T5File, flow_vae_components
from sdkit.families.keymaps import LdmClip
from sdkit.families.sd3_keys import SaiMmdit, Sd3ClipL

SD3_LAYOUT = "sai"
TIME_CHANNELS = 256
# The full-size families (their graphs all ship: MMDiT, clip_l, openclip_bigg, t5xxl_encoder,
# flux_vae_decoder, flux_vae_encoder) run the folder pipeline, as the tiny test families do.
SD3_PIPELINE = "sdkit.pipelines.models.sd3:StableDiffusion3Pipeline"
SD3_SCHEDULER: dict[str, Any] = {  # scheduler_config.json of the SD3 / 3.5 diffusers repositories
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 3.0,
}
# Where Stability's files hold each component a user may also give as its own file.
EMBEDDED = {
    "clip_l": "text_encoders.clip_l.transformer.",
    "clip_g": "text_encoders.clip_g.transformer.",
    "t5xxl": "text_encoders.t5xxl.transformer.",
    "vae": "first_stage_model.",
}
COMPONENT_FILES = {
    "clip_l": "CLIP-L text encoder, e.g. ComfyUI's clip_l.safetensors",
    "clip_g": "OpenCLIP bigG text encoder, e.g. ComfyUI's clip_g.safetensors",
    "t5xxl": "T5-XXL text encoder, e.g. t5xxl_fp16.safetensors",
    "vae": "the SD3 VAE, LDM names without first_stage_model.",
}


@dataclass(frozen=True)
class Sd3Arch:
    """The numbers of an SD3 MMDiT that its key layout and probes depend on."""

    hidden: int = 1536
    depth: int = 24
    in_channels: int = 16
    patch: int = 2
    context_dim: int = 4096  # T5-XXL
    pooled_dim: int = 2048  # CLIP-L 768 + bigG 1280
    positions: int = 192 * 192  # pos_embed_max_size ** 2
    dual_attention_layers: tuple[int, ...] = ()  # SD 3.5 Medium's MMDiT-X blocks
    qk_norm: bool = False
    head_dim: int = 64
    clip_l_layers: int = 12
    clip_g_layers: int = 32

    def probes(self) -> dict[str, tuple[int, ...]]:
        """Graph initializers and shapes a file of this architecture has."""
        h, last = self.hidden, self.depth - 1
        found: dict[str, tuple[int, ...]] = {
            "pos_embed.pos_embed": (1, self.positions, h),
            "pos_embed.proj.weight": (h, self.in_channels, self.patch, self.patch),
            "context_embedder.weight": (h, self.context_dim),
            "time_text_embed.timestep_embedder.linear_1.weight": (h, TIME_CHANNELS),
            "time_text_embed.text_embedder.linear_1.weight": (h, self.pooled_dim),
            f"transformer_blocks.{last}.norm1_context.linear.weight": (2 * h, h),  # the pre-only last block
        }
        if self.qk_norm:
            found["transformer_blocks.0.attn.norm_q.weight"] = (self.head_dim,)
        for index in self.dual_attention_layers[:1] + self.dual_attention_layers[-1:]:
            found[f"transformer_blocks.{index}.attn2.to_q.weight"] = (h, h)
        return found


@dataclass(frozen=True)
class Sd3Graphs:
    """The family's weightless graphs (shipped names or ``.onnx`` paths) and the VAE's depth.
    ``clip_l``: CLIP-L without projection (its pooled output is SD3's), ``clip_g``: bigG with it:
    the shipped SD 1.x / SDXL graphs are those very architectures. The VAE decoder and encoder
    (img2img) are FLUX.1's graphs: SD3's ``AutoencoderKL`` is the same architecture (16 latent
    channels, 128-512 channels, no quant convs); only its scaling and shift factors, family config,
    differ."""

    transformer: str | Path
    clip_l: str | Path = "clip_l"
    clip_g: str | Path = "openclip_bigg"
    t5: str | Path = "t5xxl_encoder"
    vae_decoder: str | Path = "flux_vae_decoder"
    vae_blocks: int = 4
    vae_encoder: str | Path = "flux_vae_encoder"  # img2img's, from the same VAE (optional)


def sd3_family(
    name: str,
    label: str,
    graphs: Sd3Graphs,
    arch: Sd3Arch,
    pipeline: str = SD3_PIPELINE,
    clip_tokenizers: tuple[TokenizerSource, TokenizerSource] = (CLIP_VOCAB, OPENCLIP_VOCAB),
    folder: FolderSpec | None = None,
) -> Family:
    """An SD3 family: the MMDiT (and whatever else the file holds) from a Stability-layout file,
    the rest from their own files; the published SD3 configuration."""
    components = {
        "text_encoder": FamilyComponent(graphs.clip_l, {SD3_LAYOUT: Sd3ClipL(EMBEDDED["clip_l"])}),
        "text_encoder_2": FamilyComponent(graphs.clip_g, {SD3_LAYOUT: LdmClip(EMBEDDED["clip_g"])}),
        "text_encoder_3": FamilyComponent(graphs.t5, {SD3_LAYOUT: T5File(EMBEDDED["t5xxl"])}),
        "transformer": FamilyComponent(graphs.transformer, {SD3_LAYOUT: SaiMmdit(arch.hidden)}, probes=arch.probes()),
        **flow_vae_components(graphs.vae_decoder, graphs.vae_encoder, graphs.vae_blocks, SD3_LAYOUT, EMBEDDED["vae"]),
    }
    text_outputs = {
        "text_encoder": (f"hidden_states.{arch.clip_l_layers - 1}", "pooler_output"),
        "text_encoder_2": (f"hidden_states.{arch.clip_g_layers - 1}", "text_embeds"),
        "text_encoder_3": ("last_hidden_state",),
    }
    return Family(
        name=name,
        label=label,
        pipeline=pipeline,
        components=components,
        prediction_type="flow",
        scheduler_config=SD3_SCHEDULER,
        tokenizers={"text_encoder": clip_tokenizers[0], "text_encoder_2": clip_tokenizers[1]},
        text_outputs=text_outputs,
        sample_size=128,
        latent_channels=16,
        vae_scaling_factor=1.5305,
        vae_scale_factor=2 ** (graphs.vae_blocks - 1),
        fp32_components=("vae_decoder", "vae_encoder"),
        files=COMPONENT_FILES,
        embedded=EMBEDDED,
        config={
            "vae_shift_factor": 0.0609,
            "patch_size": arch.patch,
            "denoiser_config": {"joint_attention_dim": arch.context_dim},
        },
        folder=folder,
    )


SD3_MEDIUM_ARCH = Sd3Arch()
SD35_LARGE_ARCH = Sd3Arch(hidden=2432, depth=38, qk_norm=True)
SD35_MEDIUM_ARCH = Sd3Arch(positions=384 * 384, dual_attention_layers=tuple(range(13)), qk_norm=True)
# SD3 / 3.5 diffusers ONNX folders (all read as sd3_medium: the transformer's config.json gives
# the patch and sample size; T5, text_encoder_3, is optional, as diffusers' pipeline has it).
SD3_FOLDER = FolderSpec(
    required=("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
    optional=("text_encoder_3", "vae_encoder"),
    tokenizers={"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2", "text_encoder_3": "tokenizer_3"},
    text_outputs={
        "text_encoder": (PENULTIMATE, "text_embeds"),
        "text_encoder_2": (PENULTIMATE, "text_embeds"),
        "text_encoder_3": ("last_hidden_state",),
    },
    class_names=("StableDiffusion3",),
    markers=("text_encoder_3",),
    rank=40,
    refused=FLOW_VARIANTS,
    shipped_vocab=("text_encoder_3",),
    denoiser="transformer",
    denoiser_keys=("sample_size", "patch_size"),
)
SD3_MEDIUM = sd3_family(
    "sd3_medium", "SD3 Medium", Sd3Graphs("sd3_medium_transformer"), SD3_MEDIUM_ARCH, folder=SD3_FOLDER
)
SD35_LARGE = sd3_family("sd35_large", "SD 3.5 Large", Sd3Graphs("sd35_large_transformer"), SD35_LARGE_ARCH)
SD35_MEDIUM = sd3_family("sd35_medium", "SD 3.5 Medium", Sd3Graphs("sd35_medium_transformer"), SD35_MEDIUM_ARCH)
