"""What a ``.safetensors`` file is, from its header alone (``sdkit inspect FILE``): a checkpoint
of a registered family, a LoRA, a textual-inversion embedding, a standalone VAE, or unknown.

Nothing but the header is read. The LoRA and embedding descriptions are deliberately simple
(format, rank, targets; vectors and width): the loaders of issue 14's LoRA/embedding work refine
them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdkit.families.checkpoint import DTYPE_NAMES, Checkpoint, a1111_yaml
from sdkit.families.recognised import recognise

if TYPE_CHECKING:
    from sdkit.families.family import Family

_LORA_MARKERS = (".lora_down.", ".lora_up.", ".lora_A.", ".lora_B.", ".lora.down.", ".hada_w1_a", ".lokr_w1")
_EMBEDDING_KEYS = ("emb_params", "clip_l", "clip_g")
_WIDTHS = {768: "SD 1.x (CLIP-L)", 1024: "SD 2.x (OpenCLIP-H)", 1280: "SDXL (OpenCLIP-bigG)"}


@dataclass(frozen=True)
class FileDescription:
    """A file's kind, a one-line title and labelled details."""

    kind: str  # "checkpoint", "lora", "embedding", "vae", "upscaler", "unsupported" (SD3, Chroma) or "unknown"
    title: str
    details: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        shown = "; ".join(f"{k}: {v}" for k, v in self.details[:4])
        return f"{self.title}" + (f" ({shown})" if shown else "")

    def lines(self) -> list[str]:
        width = max((len(k) for k, _ in self.details), default=0)
        return [self.title] + [f"  {k.ljust(width)}  {v}" for k, v in self.details]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "details": dict(self.details)}


def _count(checkpoint: Checkpoint, keys: Sequence[str]) -> int:
    return sum(checkpoint.entry(k).size for k in keys)


def _dtypes(checkpoint: Checkpoint, keys: Sequence[str]) -> str:
    """``fp16 x196, fp8_e4m3 scaled x40``: a ComfyUI scaled-fp8 weight (its ``scale_weight``
    applied on read) counted apart from plain ones."""
    counts = Counter(
        f"{DTYPE_NAMES.get(checkpoint.entry(k).dtype, checkpoint.entry(k).dtype)}"
        f"{' scaled' if checkpoint.scale(k) is not None else ''}"
        for k in keys
    )
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common())


def _millions(count: int) -> str:
    return f"{count / 1e6:,.1f} M parameters" if count >= 100_000 else f"{count:,} parameters"


def describe(checkpoint: Checkpoint, families: Sequence[Family]) -> FileDescription:
    """What ``checkpoint`` holds, judged from keys and shapes."""
    for family in families:
        layout = family.detect(checkpoint)
        if layout:
            return _checkpoint(checkpoint, family, layout)
    recognised = recognise(checkpoint)
    if recognised is not None:
        details = [*recognised.details, ("size", f"{checkpoint.nbytes / 1e6:,.1f} MB, {len(checkpoint)} tensors")]
        return FileDescription("unsupported", recognised.title, [*details, ("status", recognised.reason)])
    keys = checkpoint.keys()
    if any(marker in key for key in keys for marker in _LORA_MARKERS):
        return _lora(checkpoint)
    if keys and (set(keys) <= set(_EMBEDDING_KEYS) or all(k.startswith("string_to_param.") for k in keys)):
        return _embedding(checkpoint)
    if any(re.match(r"^(vae\.)?decoder\.conv_in\.weight$", k) for k in keys):
        return _vae(checkpoint)
    return _upscaler(checkpoint) or _unknown(checkpoint)


def _checkpoint(checkpoint: Checkpoint, family: Family, layout: str) -> FileDescription:
    from sdkit.families.family import LAYOUT_LABELS

    keys = checkpoint.keys()
    details = [
        ("family", f"{family.label} ({family.name})"),
        ("layout", LAYOUT_LABELS.get(layout, layout)),
        ("dtype", _dtypes(checkpoint, keys)),
        ("size", f"{checkpoint.nbytes / 1e6:,.1f} MB, {len(keys)} tensors"),
    ]
    prefixes: dict[str, list[str]] = {}
    for component in family.components:
        prefixes.setdefault(family.mapper(component, layout).prefix, []).append(component)
    for prefix, components in prefixes.items():
        # a key belongs to the longest component prefix it has (SD3's transformer reads any key
        # outside its encoders' and VAE's namespaces)
        longer = tuple(p for p in prefixes if len(p) > len(prefix) and p.startswith(prefix))
        owned = [k for k in keys if k.startswith(prefix) and not (longer and k.startswith(longer))]
        if not owned and family.files:
            continue  # a component the family takes from its own file (Flux's clip_l, t5xxl, vae)
        label = "vae" if all(c.startswith("vae") for c in components) else "+".join(components)
        details.append((label, f"{_millions(_count(checkpoint, owned))} ({_dtypes(checkpoint, owned)})"))
    held = family.held(checkpoint)
    needed = {name: what for name, what in family.files.items() if name not in held}
    if needed:
        details.append(("needs", ", ".join(f"--{name} ({what})" for name, what in needed.items())))
    ema = [k for k in keys if k.startswith("model_ema.")]
    details.append(("EMA", f"yes ({len(ema)} tensors, not used)" if ema else "no"))
    config = a1111_yaml(checkpoint.path)
    prediction = f"{family.prediction_type} (family default)"
    if config is not None:
        from sdkit.families.checkpoint import yaml_prediction

        prediction = f"{yaml_prediction(config)} (from {config.name})"
    details.append(("prediction", prediction))
    if family.inpainting:
        details.append(("inpainting", "yes (the UNet takes a mask: generate with an init image and a mask)"))
    return FileDescription("checkpoint", f"{family.label} checkpoint", details)


def _lora(checkpoint: Checkpoint) -> FileDescription:
    from sdkit.errors import ModelFormatError
    from sdkit.families.lora_file import read_lora

    keys = checkpoint.keys()
    try:
        lora = read_lora(checkpoint)
    except ModelFormatError as exc:  # LyCORIS and other files sdkit does not merge
        return FileDescription("lora", "LoRA-like file", [("note", str(exc)), ("dtype", _dtypes(checkpoint, keys))])
    fmt = {"kohya": "kohya (sd-scripts)", "peft": "PEFT / diffusers", "diffusers": "diffusers (pre-PEFT)"}[lora.format]
    lycoris = [{"loha": "LoHa", "lokr": "LoKr"}[k] for k in lora.kinds() if k != "lora"]
    if lycoris:
        fmt += ", LyCORIS " + "/".join(lycoris)
    elif lora.is_locon():
        fmt += ", LoCon (3x3 convs)"
    targets = Counter(_lora_target(m) for m in lora.modules)
    details = [
        ("format", fmt),
        ("rank", ", ".join(map(str, lora.ranks()))),
        ("targets", ", ".join(f"{t} x{n}" for t, n in targets.most_common())),
        ("dtype", _dtypes(checkpoint, keys)),
    ]
    alphas = lora.alphas()
    if alphas:
        details.append(("alpha", ", ".join(f"{a:g}" for a in alphas)))
    elif lora.peft_config:
        scales = {k: v for k, v in lora.peft_config.items() if k.endswith((".r", ".lora_alpha"))}
        details.append(("scale", ", ".join(f"{k} {v}" for k, v in sorted(scales.items()))))
    if lora.unknown:
        details.append(("not LoRA keys", f"{len(lora.unknown)} ({', '.join(lora.unknown[:3])})"))
    meta = checkpoint.metadata
    for key, label in (
        ("ss_base_model_version", "base model"),
        ("ss_network_module", "network"),
        ("ss_network_args", "network args"),
    ):
        if key in meta:
            details.append((label, meta[key]))
    return FileDescription("lora", f"LoRA ({len(lora.modules)} modules)", details)


def _lora_target(module: str) -> str:
    for prefix, name in (("lora_unet_", "unet"), ("lora_te2_", "text_encoder_2"), ("lora_te", "text_encoder")):
        if module.startswith(prefix):
            return name
    first = module.split(".", 1)[0]
    return first if first in ("unet", "text_encoder", "text_encoder_2") else "unet"


def _embedding(checkpoint: Checkpoint) -> FileDescription:
    details = []
    for key in checkpoint:
        shape = checkpoint.entry(key).shape
        vectors, width = (shape[0], shape[-1]) if len(shape) == 2 else (1, shape[-1] if shape else 0)
        norms = _norms(checkpoint, key)
        details.append(
            (key, f"{vectors} vector(s) of width {width} ({_WIDTHS.get(width, 'unknown encoder')}); L2 norms {norms}")
        )
    details.append(("token", checkpoint.name))
    return FileDescription("embedding", "textual-inversion embedding", details)


def _norms(checkpoint: Checkpoint, key: str) -> str:
    """Each vector's L2 norm (the first 8): what an embedding's strength looks like."""
    import numpy as np

    entry = checkpoint.entry(key)
    if entry.dtype not in ("F16", "F32", "BF16", "F64") or not entry.shape:
        return "?"
    vectors = checkpoint.files[0].read(entry, np.float32).reshape(-1, entry.shape[-1])
    shown = ", ".join(f"{float(n):.3g}" for n in np.linalg.norm(vectors, axis=1)[:8])
    return shown + (", ..." if len(vectors) > 8 else "")


def _vae(checkpoint: Checkpoint) -> FileDescription:
    keys = checkpoint.keys()
    prefix = "vae." if "vae.decoder.conv_in.weight" in keys else ""
    layout = "diffusers" if any(".up_blocks." in k for k in keys) else "LDM"
    latent = checkpoint.entry(f"{prefix}decoder.conv_in.weight").shape[1]
    details = [
        ("layout", layout),
        ("latent channels", str(latent)),
        ("dtype", _dtypes(checkpoint, keys)),
        ("size", _millions(_count(checkpoint, keys))),
    ]
    return FileDescription("vae", "standalone VAE", details)


UPSCALER_LAYOUTS = {"esrgan": "ESRGAN (model.N)", "real-esrgan": "Real-ESRGAN", "bsrgan": "BSRGAN", "swinir": "SwinIR"}


def _upscaler(checkpoint: Checkpoint) -> FileDescription | None:
    """An ESRGAN / Real-ESRGAN / SwinIR file (``sdkit upscale``), or None."""
    from sdkit.errors import ModelFormatError
    from sdkit.families.upscalers import canonical_names, detect_config, upscaler_graph_names

    keys = checkpoint.keys()
    try:
        arch, layout, names = canonical_names(keys)
        config = detect_config({names[k]: checkpoint.entry(k).shape for k in keys})
    except ModelFormatError:
        return None
    shipped = config.graph_name in upscaler_graph_names()
    details = [
        ("architecture", config.describe()),
        ("layout", UPSCALER_LAYOUTS.get(layout, arch)),
        ("graph", config.graph_name + ("" if shipped else " (not shipped: refused by sdkit upscale)")),
        ("dtype", _dtypes(checkpoint, keys)),
        ("size", _millions(_count(checkpoint, keys))),
    ]
    return FileDescription("upscaler", f"{config.scale}x upscaler for sdkit upscale", details)


def _unknown(checkpoint: Checkpoint) -> FileDescription:
    keys = checkpoint.keys()
    prefixes = Counter(".".join(k.split(".")[:2]) if k.count(".") > 1 else k.split(".")[0] for k in keys)
    details = [("top-level keys", ", ".join(f"{p} x{n}" for p, n in prefixes.most_common(8)))]
    conv_in = next((k for k in keys if k.endswith(("input_blocks.0.0.weight", "unet.conv_in.weight"))), None)
    if conv_in:
        details.append(("UNet conv_in", str(list(checkpoint.entry(conv_in).shape))))
    details.append(("size", f"{checkpoint.nbytes / 1e6:,.1f} MB, {len(keys)} tensors"))
    return FileDescription("unknown", "no known model family, LoRA, embedding or VAE", details)
