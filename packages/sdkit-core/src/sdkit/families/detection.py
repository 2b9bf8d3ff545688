"""Which family a checkpoint is, and with which prediction type.

Every family whose probe tensors the file has, with their shapes, is a candidate (SD 2.x 512-eps
and 768-v share their tensors: both match). The prediction type, when the user or the A1111
``.yaml`` beside the file gives one, picks among them; otherwise the highest ``priority`` wins.
A prediction no candidate has by default (a v-prediction SD 1.x fine-tune) keeps the first
candidate and overrides its prediction type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sdkit.errors import ModelFormatError
from sdkit.families.checkpoint import Checkpoint, a1111_yaml, normalize_prediction, yaml_prediction
from sdkit.families.family import LAYOUT_LABELS, Family, MappedCheckpoint
from sdkit.families.inspect import describe


@dataclass(frozen=True)
class Detected:
    """A checkpoint's family, layout and prediction type (and where the prediction came from)."""

    family: Family
    layout: str
    prediction_type: str
    prediction_from: str  # "option", "yaml", "scheduler_config.json" or "family"

    def describe(self) -> str:
        return f"{self.family.label} ({LAYOUT_LABELS.get(self.layout, self.layout)}, {self.prediction_type})"


def detect(checkpoint: Checkpoint, families: Sequence[Family], prediction: str | None = None) -> Detected:
    """The family of ``checkpoint`` among ``families`` (highest priority first); ``prediction``
    (``"v"``, ``"epsilon"``...) overrides the A1111 ``.yaml``, which overrides the family's."""
    wanted = normalize_prediction(prediction)
    source = "option"
    if wanted is None:
        wanted, source = _stated_prediction(checkpoint)
    candidates = [(family, layout) for family in families if (layout := family.detect(checkpoint))]
    if not candidates:
        what = describe(checkpoint, families).summary()
        raise ModelFormatError(f"{checkpoint.path.name} is not a checkpoint of a known model family: {what}")
    if wanted is None:
        family, layout = candidates[0]
        return Detected(family, layout, family.prediction_type, "family")
    for family, layout in candidates:
        if family.prediction_type == wanted:
            return Detected(family, layout, wanted, source)
    family, layout = candidates[0]
    return Detected(family, layout, wanted, source)


def _stated_prediction(checkpoint: Checkpoint) -> tuple[str | None, str]:
    """What the files beside the weights say: an A1111 ``.yaml`` beside a file, a diffusers
    folder's ``scheduler/scheduler_config.json``."""
    config = a1111_yaml(checkpoint.path)
    if config is not None:
        return yaml_prediction(config), "yaml"
    scheduler = checkpoint.path / "scheduler" / "scheduler_config.json"
    if checkpoint.is_folder and scheduler.is_file():
        try:
            value = json.loads(scheduler.read_text(encoding="utf-8")).get("prediction_type")
        except (OSError, ValueError, AttributeError):
            raise ModelFormatError(f"{scheduler} is not a readable JSON object") from None
        if value is not None:
            return normalize_prediction(str(value)), "scheduler_config.json"
    return None, "family"


def load_checkpoint(
    path: str | os.PathLike[str], families: Sequence[Family], prediction: str | None = None
) -> MappedCheckpoint:
    """Open ``path`` (a ``.safetensors`` file or a diffusers folder), detect its family and map
    its weights: a lazy ``WeightSet`` per component, checked complete."""
    checkpoint = Checkpoint.open(path)
    found = detect(checkpoint, families, prediction)
    mapped = found.family.map(checkpoint, found.layout)
    return replace(mapped, prediction_type=found.prediction_type)
