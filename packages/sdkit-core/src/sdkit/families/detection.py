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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sdkit.errors import ModelFormatError, OptionError, UnsupportedFamilyError
from sdkit.families.checkpoint import Checkpoint, a1111_yaml, normalize_prediction, yaml_prediction
from sdkit.families.family import LAYOUT_LABELS, Family, MappedCheckpoint
from sdkit.families.inspect import describe
from sdkit.families.recognised import recognise


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
        recognised = recognise(checkpoint)
        if recognised is not None:
            name = checkpoint.path.name
            raise UnsupportedFamilyError(f"{name} is a {recognised.model} checkpoint: {recognised.reason}")
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
        except (OSError, ValueError, AttributeError, RecursionError):
            raise ModelFormatError(f"{scheduler} is not a readable JSON object") from None
        if value is not None:
            return normalize_prediction(str(value)), "scheduler_config.json"
    return None, "family"


def load_checkpoint(
    path: str | os.PathLike[str],
    families: Sequence[Family],
    prediction: str | None = None,
    files: Mapping[str, str | os.PathLike[str]] | None = None,
) -> MappedCheckpoint:
    """Open ``path`` (a ``.safetensors`` file or a diffusers folder), detect its family and map
    its weights: a lazy ``WeightSet`` per component, checked complete. ``files``: the components
    the family takes from their own files (``Family.files``: Flux's ``clip_l``, ``t5xxl``, ``vae``)."""
    checkpoint = Checkpoint.open(path)
    return map_detected(checkpoint, detect(checkpoint, families, prediction), files)


def map_detected(
    checkpoint: Checkpoint, found: Detected, files: Mapping[str, str | os.PathLike[str]] | None = None
) -> MappedCheckpoint:
    """``checkpoint`` mapped as the family ``detect`` found for it (``load_checkpoint`` without
    reading the header's family again), with the component ``files`` the family takes (each read
    under ``Family.file_prefix``: a file replaces a component the checkpoint holds itself)."""
    given = {name: path for name, path in (files or {}).items() if path is not None}
    family = found.family
    check_component_files(checkpoint.path.name, family, given, family.held(checkpoint))
    if given:
        checkpoint = checkpoint.with_files(given, {name: family.file_prefix(name) for name in given})
    mapped = family.map(checkpoint, found.layout)
    return replace(mapped, prediction_type=found.prediction_type)


def check_component_files(name: str, family: Family, given: Mapping[str, object], held: Sequence[str] = ()) -> None:
    """One error naming every component file the family needs and was not given (with its
    command-line flag), or given files the family does not take. ``held``: the components the
    checkpoint holds itself (``Family.held``), whose files are optional."""
    unexpected = [n for n in given if n not in family.files]
    if unexpected:
        takes = f"it takes {', '.join(family.files)}" if family.files else "it holds every component itself"
        raise OptionError(f"{name} is a {family.label} checkpoint: {', '.join(unexpected)} not used ({takes})")
    missing = [n for n in family.files if given.get(n) is None and n not in held]
    if missing:
        flags = ", ".join(f"--{n} FILE ({family.files[n]})" for n in missing)
        python = ", ".join(f"{n}=PATH" for n in missing)
        what = (
            f"does not hold the {family.label} {', '.join(missing)}"
            if held
            else (f"holds the {family.label} transformer only")
        )
        raise ModelFormatError(
            f"{name} {what}; give its other components: {flags} (in Python: load_pipeline(path, {python}))"
        )
