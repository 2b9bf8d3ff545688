"""``XLRequest``: a ``GenerationRequest`` with SDXL's own fields, checked once.

Names and defaults are diffusers' ``StableDiffusionXLPipeline`` arguments; sizes are
``(height, width)`` pairs, as there. The refiner fields follow A1111 ("Refiner", "Refiner switch
at"; its API's ``refiner_switch_at``)::

    [image] = pipe.generate("a castle", prompt_2="oil painting", original_size=(2048, 2048),
                            refiner=refiner_pipe, refiner_switch_at=0.8, seed=1)

- ``prompt_2`` / ``negative_prompt_2``: the text for the second text encoder (OpenCLIP bigG);
  empty means the same as ``prompt`` / ``negative_prompt`` (diffusers' ``prompt_2 or prompt``).
- ``original_size``, ``crops_coords_top_left``, ``target_size``: SDXL's micro-conditioning
  (``time_ids``); None sizes are the generated image's ``(height, width)``.
- ``negative_original_size``, ``negative_crops_coords_top_left``, ``negative_target_size``: the
  negative row of ``time_ids`` (how diffusers fills it in: ``sdkit.pipelines.models.sdxl.time_ids``).
- ``aesthetic_score`` / ``negative_aesthetic_score`` (6.0 / 2.5): the refiner's ``time_ids``.
- ``refiner``: an SDXL pipeline from ``sdkit.load_pipeline`` (a refiner folder, or any SDXL
  model) that takes over the denoising at ``refiner_switch_at``, a fraction of the noise schedule
  (diffusers' ``denoising_end`` on the base and ``denoising_start`` on the refiner: the base runs
  the timesteps ``>= round(1000 * (1 - refiner_switch_at))``). A1111 switches at a fraction of the
  *steps* instead; with its default schedule the two agree up to a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sdkit.errors import InputError
from sdkit.pipelines.request import GenerationRequest, as_float, as_text

Size = tuple[int, int]
SIZE_FIELDS = ("original_size", "target_size", "negative_original_size", "negative_target_size")
CROP_FIELDS = ("crops_coords_top_left", "negative_crops_coords_top_left")
TEXT_FIELDS = ("prompt_2", "negative_prompt_2")


def as_pair(value: Any, what: str, minimum: int) -> Size:
    """``(a, b)`` from a 2-sequence of integers >= ``minimum``, or an InputError naming ``what``."""
    try:
        items = list(value)
    except TypeError:
        raise InputError(f"{what} must be a (height, width) pair of integers, got {value!r}") from None
    if len(items) != 2 or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < minimum for v in items
    ):
        raise InputError(f"{what} must be a (height, width) pair of integers >= {minimum}, got {value!r}")
    return int(items[0]), int(items[1])


@dataclass(frozen=True, eq=False)
class XLRequest(GenerationRequest):
    """A ``GenerationRequest`` for SDXL pipelines (the fields are in the module docstring)."""

    prompt_2: str = ""
    negative_prompt_2: str = ""
    original_size: Size | None = None
    crops_coords_top_left: Size = (0, 0)
    target_size: Size | None = None
    negative_original_size: Size | None = None
    negative_crops_coords_top_left: Size = (0, 0)
    negative_target_size: Size | None = None
    aesthetic_score: float = 6.0
    negative_aesthetic_score: float = 2.5
    refiner: Any = None  # an SDXL Pipeline (checked by the pipeline's plan)
    refiner_switch_at: float = 0.8

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        out = super().checked(values)
        for what in TEXT_FIELDS:
            if what in values:
                out[what] = as_text(values[what] or "", what)
        for what in SIZE_FIELDS:
            if values.get(what) is not None:
                out[what] = as_pair(values[what], what, 1)
        for what in CROP_FIELDS:
            if what in values:
                out[what] = as_pair(values[what], what, 0)
        for what in ("aesthetic_score", "negative_aesthetic_score"):
            if what in values:
                out[what] = as_float(values[what], what)
        if "refiner_switch_at" in values:
            switch = as_float(values["refiner_switch_at"], "refiner_switch_at")
            if not 0.0 < switch < 1.0:
                raise InputError(f"refiner_switch_at must be between 0 and 1 (exclusive), got {switch:g}")
            out["refiner_switch_at"] = switch
        refiner = values.get("refiner")
        if refiner is not None and not callable(getattr(refiner, "refine", None)):
            raise InputError(f"refiner must be an SDXL pipeline from sdkit.load_pipeline, not {type(refiner).__name__}")
        return out
