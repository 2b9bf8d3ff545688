"""FLUX.1 dev and schnell transformer files as families (``flux_family``), BFL layout.

The files users have (``flux1-dev.safetensors``, ``flux1-schnell.safetensors``, ComfyUI's
copies under ``model.diffusion_model.``, ``flux1-dev-fp8``) hold the transformer only, in BFL's
key layout (``sdkit.families.flux_keys``). A family here has one component, ``transformer``, and
detection tells dev from schnell by the guidance embedder (``guidance_in``: dev's distilled
guidance input; schnell has none): both families' probes match a dev file, and dev's higher
``priority`` wins.

The published numbers (diffusers' ``FluxTransformer2DModel`` config of FLUX.1-dev/-schnell):
width 3072 (24 heads of 128), 64 input channels (16-channel latents packed 2x2), T5-XXL context
4096, CLIP-L pooled 768, timestep and guidance embedded from 256 sinusoidal channels, 19 double
and 38 single blocks, MLP ratio 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdkit.families.family import Family, FamilyComponent
from sdkit.families.flux_keys import BflFlux

FLUX_LAYOUT = "bfl"
TIME_CHANNELS = 256  # the sinusoidal embedding width of timestep and guidance
# The pipeline a transformer-only file will get once the full-size Flux graphs ship (and the
# pipeline takes CLIP-L, T5-XXL and the VAE from their own files); until then load_pipeline
# refuses such a file by name (``sdkit.pipelines.families.PENDING``).
FLUX_SINGLE_FILE_PIPELINE = "sdkit.pipelines.flux_single_file:FluxSingleFilePipeline"


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


def flux_family(
    name: str,
    label: str,
    transformer_graph: str | Path,
    arch: FluxArch,
    guidance: bool,
    pipeline: str = FLUX_SINGLE_FILE_PIPELINE,
) -> Family:
    """A Flux transformer family: the graph (diffusers' parameter names), the BFL key map."""
    component = FamilyComponent(
        graph=transformer_graph,
        layouts={FLUX_LAYOUT: BflFlux(arch.hidden)},
        probes=arch.probes(guidance),
    )
    return Family(
        name=name,
        label=label,
        pipeline=pipeline,
        components={"transformer": component},
        prediction_type="flow",
        sample_size=128,
        latent_channels=16,
        vae_scaling_factor=0.3611,
        priority=1 if guidance else 0,
    )


FLUX = FluxArch()
FLUX_DEV = flux_family("flux_dev", "FLUX.1 dev", "flux_dev_transformer", FLUX, guidance=True)
FLUX_SCHNELL = flux_family("flux_schnell", "FLUX.1 schnell", "flux_schnell_transformer", FLUX, guidance=False)
