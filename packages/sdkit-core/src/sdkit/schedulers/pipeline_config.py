"""What diffusers' pipelines do to a scheduler config before they use it.

A scheduler built from a model's ``scheduler_config.json`` takes the diffusers class's
defaults for every key the file lacks. Some diffusers pipelines then rewrite two of those
settings in their constructor (with a deprecation warning) - and which ones depends on the
pipeline, not on the scheduler. As of diffusers 0.42.1:

==================================  =====================================================
pipeline                            config fix-ups in ``__init__``
==================================  =====================================================
StableDiffusionPipeline,            ``steps_offset`` not 1 -> 1; ``clip_sample`` True -> False
StableDiffusionImg2ImgPipeline
StableDiffusionInpaintPipeline      ``steps_offset`` not 1 -> 1 (and PNDM's ``skip_prk_steps``,
                                    a sampler sdkit does not have)
StableDiffusionXL*, all             none
StableDiffusion(XL)ControlNet*
==================================  =====================================================

The issue this fixes: an EulerDiscreteScheduler config (no ``clip_sample`` key) used with DDIM
gets DDIMScheduler's class default ``clip_sample=True``; StableDiffusionPipeline turns it off,
so an sdkit pipeline that only applied the class default clipped x0 and its images differed
from diffusers' by up to 0.66 on [0, 1]. The same config under an SDXL or ControlNet pipeline
keeps clipping in diffusers, and must here too.

Use it on the config before creating the scheduler::

    config = pipeline_config_fixups(layout.scheduler_config, "ddim", "StableDiffusionPipeline")
    sched = create_scheduler("ddim", config=config)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdkit.errors import OptionError
from sdkit.plugins import SchedulerRegistry
from sdkit.schedulers.base import SD15_CONFIG, Scheduler, SchedulerConfig
from sdkit.schedulers.names import scheduler_class

_SD_FIXUPS = ("steps_offset", "clip_sample")
PIPELINE_FIXUPS: dict[str, tuple[str, ...]] = {
    "StableDiffusionPipeline": _SD_FIXUPS,
    "StableDiffusionImg2ImgPipeline": _SD_FIXUPS,
    "StableDiffusionInpaintPipeline": ("steps_offset",),
    "StableDiffusionXLPipeline": (),
    "StableDiffusionXLImg2ImgPipeline": (),
    "StableDiffusionXLInpaintPipeline": (),
    "StableDiffusionControlNetPipeline": (),
    "StableDiffusionControlNetImg2ImgPipeline": (),
    "StableDiffusionControlNetInpaintPipeline": (),
    "StableDiffusionXLControlNetPipeline": (),
    "StableDiffusionXLControlNetImg2ImgPipeline": (),
    "StableDiffusionXLControlNetInpaintPipeline": (),
}
"""The diffusers pipeline class -> the config keys its constructor rewrites."""


def _effective(key: str, data: Mapping[str, Any], cls: type[Scheduler]) -> Any:
    """The value a scheduler of ``cls`` ends up with for ``key``: the file's, else the diffusers
    class default, else sdkit's SchedulerConfig default."""
    if key in data:
        return data[key]
    if key in cls.diffusers_defaults:
        return cls.diffusers_defaults[key]
    return getattr(SchedulerConfig(), key)


def pipeline_config_fixups(
    config: Mapping[str, Any] | None,
    sampler: str | type[Scheduler],
    pipeline: str,
    registry: SchedulerRegistry | None = None,
) -> dict[str, Any]:
    """A copy of ``config`` (None: Stable Diffusion 1.x's) with the changes diffusers' ``pipeline``
    (a class name from ``PIPELINE_FIXUPS``) makes for ``sampler`` (a name or alias, or a class):
    ``steps_offset`` set to 1 where it would not be 1, ``clip_sample`` set to False where it
    would be True. Keys are only added or changed where that changes the effective value."""
    if pipeline not in PIPELINE_FIXUPS:
        raise OptionError(f"unknown pipeline {pipeline!r}; use one of {', '.join(PIPELINE_FIXUPS)}")
    if config is not None and not isinstance(config, Mapping):
        raise OptionError(f"scheduler config must be a dict (scheduler_config.json), got {type(config).__name__}")
    cls = sampler if isinstance(sampler, type) else scheduler_class(sampler, registry=registry)
    data = dict(SD15_CONFIG if config is None else config)
    fixups = PIPELINE_FIXUPS[pipeline]
    if "steps_offset" in fixups and _effective("steps_offset", data, cls) != 1:
        data["steps_offset"] = 1
    if "clip_sample" in fixups and _effective("clip_sample", data, cls) is True:
        data["clip_sample"] = False
    return data
