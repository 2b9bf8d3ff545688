"""Transformer checkpoints sdkit recognises from their keys when no registered family matches
them: SD3 / SD 3.5 MMDiT files (Stability's layout) and Chroma files (Flux-derived) of other
sizes than the families' (``sdkit.families.sd3``, ``sdkit.families.chroma``), or incomplete ones.

``describe`` names them (``sdkit inspect``: which model, its depth and width, the text encoders
the file holds or needs) and ``detect`` refuses them with that name and the reason, instead of
"no known model family"; a folder exported by diffusers/optimum runs them today.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sdkit.families.checkpoint import Checkpoint

# ComfyUI and Stability's all-in-one files keep the transformer under this prefix; a
# transformer-only file (ComfyUI's diffusion_models/ folder) has none.
_PREFIXES = ("model.diffusion_model.", "")
_SD3_ENCODERS = ("clip_l", "clip_g", "t5xxl")


@dataclass(frozen=True)
class Recognised:
    """A recognised transformer checkpoint: what it is, what it holds, why it does not run."""

    model: str  # "SD 3.5 Large", "Chroma"...
    details: list[tuple[str, str]]
    reason: str

    @property
    def title(self) -> str:
        return f"{self.model} checkpoint (recognised; not a size sdkit has a family for)"


def recognise(checkpoint: Checkpoint) -> Recognised | None:
    """An SD3 / SD 3.5 or Chroma file, judged from its keys and shapes; None for anything else."""
    for prefix in _PREFIXES:
        if f"{prefix}joint_blocks.0.x_block.attn.qkv.weight" in checkpoint:
            return _sd3(checkpoint, prefix)
        if f"{prefix}distilled_guidance_layer.in_proj.weight" in checkpoint:
            return _chroma(checkpoint, prefix)
    return None


def _blocks(checkpoint: Checkpoint, pattern: str) -> int:
    found = {int(m.group(1)) for k in checkpoint if (m := re.match(pattern, k))}
    return max(found) + 1 if found else 0


def _sd3(checkpoint: Checkpoint, prefix: str) -> Recognised:
    depth = _blocks(checkpoint, re.escape(prefix) + r"joint_blocks\.(\d+)\.")
    hidden = checkpoint.entry(f"{prefix}x_embedder.proj.weight").shape[0]
    mmdit_x = f"{prefix}joint_blocks.0.x_block.attn2.qkv.weight" in checkpoint  # SD 3.5 Medium's extra attention
    model = {(24, False): "SD3 Medium", (24, True): "SD 3.5 Medium", (38, False): "SD 3.5 Large"}.get(
        (depth, mmdit_x), "SD3 / SD 3.5"
    )
    encoders = [n for n in _SD3_ENCODERS if any(k.startswith(f"text_encoders.{n}.") for k in checkpoint)]
    details = [
        ("transformer", f"MMDiT{'-X' if mmdit_x else ''}, {depth} joint blocks, width {hidden}"),
        ("text encoders", ", ".join(encoders) + " (in the file)" if encoders else "none in the file"),
    ]
    return Recognised(
        model,
        details,
        "its MMDiT matches none of sdkit's SD3 families (SD3 Medium, SD 3.5 Large, SD 3.5 Medium: the width, "
        "depth, position table and q/k norms of each); a diffusers/optimum ONNX export folder of the model loads",
    )


def _chroma(checkpoint: Checkpoint, prefix: str) -> Recognised:
    double = _blocks(checkpoint, re.escape(prefix) + r"double_blocks\.(\d+)\.")
    single = _blocks(checkpoint, re.escape(prefix) + r"single_blocks\.(\d+)\.")
    hidden = checkpoint.entry(f"{prefix}img_in.weight").shape[0]
    details = [
        ("transformer", f"Flux-derived, {double} double and {single} single blocks, width {hidden}"),
        ("text encoders", "none in the file (Chroma takes T5-XXL only)"),
    ]
    return Recognised(
        "Chroma",
        details,
        "its transformer matches no sdkit Chroma family (Chroma1-HD's width 3072, 19 double and 38 single "
        "blocks, a 5-layer approximator of width 5120); a diffusers/optimum ONNX export folder of the model loads",
    )
