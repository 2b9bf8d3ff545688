"""Stable Diffusion families (1.x, 2.x, XL, inpainting) built from their diffusers configs.

``sd_family(...)`` turns the architecture numbers a diffusers ``config.json`` holds (UNet block
channels and types, layers per block, cross-attention width, text-time embedding; text encoder
width, depth and kind; VAE block count) into a ``Family``: the key mappers of both checkpoint
layouts for each component, and the probe tensors detection checks. The built-in families
(``sdkit.families.builtin``) and the tiny test families use it alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.families.clip_tokenizer import TokenizerSource
from sdkit.families.family import Family, FamilyComponent, FolderSpec
from sdkit.families.keymaps import KeyMapper, LdmClip, LdmUNet, LdmVae, OpenClip, Prefixed

SD_PIPELINE = "sdkit.pipelines.models.stable_diffusion:StableDiffusionPipeline"


@dataclass(frozen=True)
class TextEncoderArch:
    """A text encoder of a family.

    kind: ``"clip"`` (OpenAI CLIP, stored as transformers' model in LDM files) or ``"openclip"``
        (OpenCLIP's text tower, stored in its own names, fused q/k/v).
    ldm_prefix: its namespace in LDM/SGM files (``cond_stage_model.transformer.``...).
    layers: encoder layers of the graph; hidden_size, vocab_size: its width and vocabulary.
    projection_dim: the width of ``text_projection`` when the graph reads it (SDXL's bigG).
    """

    component: str
    graph: str | Path
    kind: str
    ldm_prefix: str
    hidden_size: int
    layers: int
    vocab_size: int = 49408
    projection_dim: int | None = None

    def mappers(self) -> dict[str, KeyMapper]:
        if self.kind == "clip":
            ldm: KeyMapper = LdmClip(self.ldm_prefix)
        else:
            ldm = OpenClip(self.layers, self.projection_dim is not None, self.ldm_prefix)
        return {"ldm": ldm, "diffusers": Prefixed(f"{self.component}.")}

    def probes(self) -> dict[str, tuple[int, ...]]:
        h = self.hidden_size
        probes: dict[str, tuple[int, ...]] = {
            "text_model.embeddings.token_embedding.weight": (self.vocab_size, h),
            f"text_model.encoder.layers.{self.layers - 1}.self_attn.q_proj.weight": (h, h),
        }
        if self.projection_dim is not None:
            probes["text_projection.weight"] = (self.projection_dim, h)
        return probes


def unet_probes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The UNet tensors that tell SD families apart, shaped as ``config`` says: ``conv_in``
    (input channels: 9 for inpainting), the first cross-attention block's ``proj_in`` (a 1x1 conv
    in SD 1.x, Linear from SD 2.x on) and ``attn2.to_k`` (the text width), SDXL's
    ``add_embedding`` (6 time ids for the base, 5 for the refiner)."""
    channels = list(config["block_out_channels"])
    probes: dict[str, tuple[int, ...]] = {"conv_in.weight": (channels[0], int(config.get("in_channels", 4)), 3, 3)}
    for block, kind in enumerate(config["down_block_types"]):
        if kind.startswith("CrossAttn"):
            c = channels[block]
            attention = f"down_blocks.{block}.attentions.0."
            probes[attention + "proj_in.weight"] = (c, c) if config.get("use_linear_projection") else (c, c, 1, 1)
            probes[attention + "transformer_blocks.0.attn2.to_k.weight"] = (c, int(config["cross_attention_dim"]))
            break
    if config.get("addition_embed_type") == "text_time":
        width = int(config["projection_class_embeddings_input_dim"])
        probes["add_embedding.linear_1.weight"] = (4 * channels[0], width)
    return probes


def unet_component(graph: str | Path, config: Mapping[str, Any], ldm_prefix: str) -> FamilyComponent:
    up_attention = tuple(kind.startswith("CrossAttn") for kind in config["up_block_types"])
    ldm = LdmUNet(int(config.get("layers_per_block", 2)), up_attention, ldm_prefix)
    return FamilyComponent(graph, {"ldm": ldm, "diffusers": Prefixed("unet.")}, unet_probes(config))


def vae_components(
    config: Mapping[str, Any], graphs: tuple[str | Path, str | Path], ldm_prefix: str
) -> dict[str, FamilyComponent]:
    """The VAE encoder and decoder graphs; one LDM/diffusers namespace feeds both."""
    blocks = len(config["block_out_channels"])
    layouts: dict[str, KeyMapper] = {"ldm": LdmVae(blocks, ldm_prefix), "diffusers": Prefixed("vae.")}
    return {"vae_encoder": FamilyComponent(graphs[0], layouts), "vae_decoder": FamilyComponent(graphs[1], layouts)}


def _aesthetic(unet_config: Mapping[str, Any], text_encoders: tuple[TextEncoderArch, ...]) -> bool:
    """Whether an SDXL UNet takes 5 time ids (original size, crop, aesthetic score: a refiner)
    rather than 6: its text-time width is the pooled text width plus 256 per id (diffusers'
    ``addition_time_embed_dim``)."""
    pooled = sum(e.projection_dim or 0 for e in text_encoders)
    per_id = int(unet_config.get("addition_time_embed_dim", 256))
    width = int(unet_config.get("projection_class_embeddings_input_dim", pooled + 6 * per_id))
    return (width - pooled) // per_id == 5


def sd_family(
    name: str,
    label: str,
    *,
    unet_graph: str | Path,
    unet_config: Mapping[str, Any],
    text_encoders: tuple[TextEncoderArch, ...],
    vae_config: Mapping[str, Any],
    scheduler_config: Mapping[str, Any],
    tokenizers: Mapping[str, TokenizerSource],
    text_outputs: Mapping[str, tuple[str, ...]],
    prediction_type: str = "epsilon",
    pipeline: str = SD_PIPELINE,
    vae_graphs: tuple[str | Path, str | Path] = ("vae_encoder", "vae_decoder"),
    unet_prefix: str = "model.diffusion_model.",
    xl: bool = False,
    vae_prefix: str = "first_stage_model.",
    priority: int = 0,
    folder: FolderSpec | None = None,
) -> Family:
    """A Stable Diffusion family from diffusers configs (see the module docstring). ``xl``: an
    SDXL family (empty negative prompt as zeros for a base, aesthetic-score time ids for a
    refiner, told apart by its UNet's time-embedding width; the VAE kept in fp32). ``folder``:
    how its ONNX export folders look (``Family.folder``)."""
    components: dict[str, FamilyComponent] = {"unet": unet_component(unet_graph, unet_config, unet_prefix)}
    for encoder in text_encoders:
        components[encoder.component] = FamilyComponent(encoder.graph, encoder.mappers(), encoder.probes())
    components.update(vae_components(vae_config, vae_graphs, vae_prefix))
    blocks = len(vae_config["block_out_channels"])
    latents = int(vae_config.get("latent_channels", 4))
    return Family(
        name=name,
        label=label,
        pipeline=pipeline,
        components=components,
        prediction_type=prediction_type,
        scheduler_config=dict(scheduler_config),
        tokenizers=dict(tokenizers),
        text_outputs=dict(text_outputs),
        sample_size=int(unet_config.get("sample_size", 64)),
        latent_channels=latents,
        vae_scaling_factor=float(vae_config.get("scaling_factor", 0.18215)),
        vae_scale_factor=2 ** (blocks - 1),
        force_zeros_for_empty_prompt=xl and not _aesthetic(unet_config, text_encoders),
        requires_aesthetics_score=xl and _aesthetic(unet_config, text_encoders),
        fp32_components=("vae_decoder", "vae_encoder") if xl else (),
        inpainting=int(unet_config.get("in_channels", latents)) == 2 * latents + 1,
        priority=priority,
        folder=folder,
    )
