"""A1111's listing and status shapes (samplers, schedulers, models, LoRAs, progress, errors),
filled from sdkit's registries."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class SamplerItem(BaseModel):
    name: str
    aliases: list[str]
    options: dict[str, str] = Field(default_factory=dict)


class SchedulerItem(BaseModel):
    name: str
    label: str
    aliases: list[str] | None = None
    default_rho: float = -1
    need_inner_model: bool = False


class SDModelItem(BaseModel):
    title: str
    model_name: str
    hash: str | None = None
    sha256: str | None = None
    filename: str
    config: str | None = None


class SDVaeItem(BaseModel):
    model_name: str
    filename: str = Field(description="relative to --vae-dir (or --ckpt-dir for *.vae.safetensors)")


class PNGInfoRequest(BaseModel):
    image: str = Field(description="base64 image (data: URLs too)")


class PNGInfoResponse(BaseModel):
    info: str = Field(description="the image's A1111 parameters text")
    items: dict[str, Any] = Field(description="the image's other text chunks")
    parameters: dict[str, Any] = Field(description="the parameters text parsed, A1111's labels as keys")


class MemoryResponse(BaseModel):
    ram: dict[str, Any]
    cuda: dict[str, Any]


class InternalProgressRequest(BaseModel):
    """``POST /internal/progress`` (A1111 1.6+): a task's progress by its id (``force_task_id``)."""

    id_task: str | None = None
    id_live_preview: int = -1
    live_preview: bool = True


class InternalProgressResponse(BaseModel):
    active: bool
    queued: bool
    completed: bool
    progress: float | None = None
    eta: float | None = None
    live_preview: str | None = Field(None, description="a data: URL, when a newer preview than id_live_preview exists")
    id_live_preview: int | None = None
    textinfo: str | None = None


class LoraItem(BaseModel):
    name: str
    alias: str
    path: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class ProgressState(BaseModel):
    skipped: bool = False
    interrupted: bool = False
    stopping_generation: bool = False
    job: str = ""
    job_count: int = 0
    job_timestamp: str = "0"
    job_no: int = 0
    sampling_step: int = 0
    sampling_steps: int = 0
    queue_pending: int = Field(0, description="sdkit: requests waiting behind the running one")


class ProgressResponse(BaseModel):
    progress: float = Field(description="fraction of the running job done, 0..1")
    eta_relative: float = Field(description="estimated seconds left")
    state: ProgressState
    current_image: str | None = Field(None, description="base64 PNG preview; needs --preview-decoder")
    textinfo: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: the error's kind and a message a person can act on."""

    error: str
    detail: str
    errors: list[dict[str, Any]] | None = None


def samplers() -> list[SamplerItem]:
    """Every registered sampler under its A1111 label, its other names as aliases. A flow model's
    variant of a sampler ("uni_pc_flow") is listed under that sampler, as one more name."""
    from sdkit.plugins import get_plugins
    from sdkit.schedulers import sampler_label

    registry = get_plugins().schedulers
    aliases = registry.aliases()
    variants: dict[str, list[str]] = {}
    for canonical, cls in registry.items():
        base = getattr(cls, "variant_of", "")
        if base and registry.get(base) is not None:
            variants.setdefault(base, []).append(canonical)
    listed_under_base = {v for names in variants.values() for v in names}
    by_label: dict[str, list[str]] = {}  # one item per label: a flow variant ("euler_a_flow") joins its sampler's
    for canonical in registry.names():
        if canonical in listed_under_base:
            continue
        label = sampler_label(canonical)
        names = [canonical, *(a for a, c in aliases.items() if c == canonical), *variants.get(canonical, [])]
        by_label.setdefault(label, []).extend(names)
    return [
        SamplerItem(name=label, aliases=[n for n in dict.fromkeys(names) if n != label])
        for label, names in by_label.items()
    ]


# A1111's labels where the listing's differ from the "Schedule type:" ones sdkit writes: "normal" is
# "Normal" here ("Automatic", the sampler's own, is the first item), and Align Your Steps' SDXL and
# SVD tables get labels of their own so each can be picked ("Align Your Steps" on an SDXL model
# takes the SDXL table anyway).
SCHEDULE_LABELS = {
    "normal": "Normal",
    "align_your_steps_sdxl": "Align Your Steps SDXL",
    "align_your_steps_svd": "Align Your Steps SVD",
}


def schedulers() -> list[SchedulerItem]:
    """``automatic`` (the sampler's own) and every schedule sdkit has, in A1111 1.9+'s shape."""
    from sdkit.schedulers.names import SCHEDULE_TABLE

    items = [SchedulerItem(name="automatic", label="Automatic")]
    for name, (label, aliases) in SCHEDULE_TABLE.items():
        items.append(
            SchedulerItem(
                name=name,
                label=SCHEDULE_LABELS.get(name, label),
                aliases=list(aliases) or None,
                default_rho=7.0 if name == "karras" else -1,
            )
        )
    return items


def schedule_name(text: str | None) -> str | None:
    """A request's ``scheduler`` as sdkit's schedule name: None for A1111's "Automatic" (the
    sampler's own), a label of ``schedulers()`` as its name, anything else as sent (sdkit
    resolves its own aliases, or says what it knows)."""
    if not text or text.strip().lower() == "automatic":
        return None
    by_label = {item.label.lower(): item.name for item in schedulers()}
    return by_label.get(text.strip().lower(), text)
