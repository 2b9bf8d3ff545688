"""The request of the flow-matching pipelines (SD3/3.5, Flux.1, Chroma): the base request with
``sampler="euler"`` by default (their only sampler today, ``euler_flow``) and the T5 window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdkit.pipelines.request import GenerationRequest, as_int


@dataclass(frozen=True, eq=False)
class FlowRequest(GenerationRequest):
    """``GenerationRequest`` plus ``max_sequence_length``: T5 tokens per prompt (diffusers' name and
    meaning; None: the family's default, SD3 256, Flux and Chroma 512). A transformer exported with a
    fixed text length needs exactly that length. ``sampler`` defaults to Euler (flow)."""

    sampler: str = "euler"
    max_sequence_length: int | None = None

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        values = {"sampler": "euler", **values} if values.get("sampler") is None else values
        out = super().checked(values)
        length = values.get("max_sequence_length")
        if length is not None:
            out["max_sequence_length"] = as_int(length, "max_sequence_length", 2)
        return out
