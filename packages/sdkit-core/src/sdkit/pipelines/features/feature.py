"""What a pipeline can do beyond txt2img, declared as data, and what a request asks for.

Each pipeline class declares ``features: frozenset[Feature]`` (``Pipeline.features``).
``Pipeline.plan`` refuses a request that asks for a feature its class does not declare, with one
``UnsupportedFeatureError`` naming the feature, the field that asked for it and the family,
before anything compiles or runs: an option a pipeline cannot honour is never silently dropped.
The CLI makes the same check from the pipeline class before it loads the model.

A request asks for a feature by a field's value, never by a field's presence, so the defaults
(``enable_hr=False``, ``vae_tiling=False``, ``control=()``: what A1111 clients send) ask for
nothing. ``Feature.LORA`` is asked for by ``Pipeline.set_loras`` with at least one LoRA.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from sdkit.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sdkit.pipelines.request import GenerationRequest


class Feature(Enum):
    """A capability beyond txt2img; the value is the name errors and docs use."""

    IMG2IMG = "img2img"
    MASK = "inpainting"
    CONTROLNET = "ControlNet"
    HIRES = "hires fix"
    VAE_TILING = "VAE tiling"
    REFINER = "refiner"
    PROMPT_WEIGHTING = "A1111 prompt weighting"
    LORA = "LoRA"
    CLIP_SKIP = "clip skip"


# The request field (or method) that asks for each feature, as the error names it.
ASKED_BY = {
    Feature.IMG2IMG: "init_image",
    Feature.MASK: "mask",
    Feature.CONTROLNET: "control",
    Feature.HIRES: "enable_hr=True",
    Feature.VAE_TILING: "vae_tiling=True",
    Feature.REFINER: "refiner",
    Feature.PROMPT_WEIGHTING: "prompt_weighting",
    Feature.LORA: "set_loras",
    Feature.CLIP_SKIP: "clip_skip",
}


def requested_features(request: GenerationRequest) -> frozenset[Feature]:
    """The features ``request`` asks for (a mask asks for img2img too: it repaints an init image)."""
    asked = {
        Feature.IMG2IMG: request.init_image is not None,
        Feature.MASK: request.mask is not None,
        Feature.CONTROLNET: bool(request.control),
        Feature.HIRES: request.enable_hr,
        Feature.VAE_TILING: request.vae_tiling,
        Feature.REFINER: getattr(request, "refiner", None) is not None,
        Feature.PROMPT_WEIGHTING: request.prompt_weighting != "none",
        Feature.CLIP_SKIP: request.clip_skip > 1,
    }
    return frozenset(feature for feature, yes in asked.items() if yes)


def refuse_undeclared(asked: Iterable[Feature], declared: frozenset[Feature], family: str) -> None:
    """One ``UnsupportedFeatureError`` naming every feature in ``asked`` that ``declared`` lacks
    (in ``Feature`` order), or nothing."""
    asked = set(asked)
    missing = [feature for feature in Feature if feature in asked and feature not in declared]
    if missing:
        supported = ["txt2img", *(feature.value for feature in Feature if feature in declared)]
        raise UnsupportedFeatureError(family, [f.value for f in missing], [ASKED_BY[f] for f in missing], supported)
