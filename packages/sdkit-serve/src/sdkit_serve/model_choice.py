"""Which model (and VAE, and refiner) a request runs on, from A1111's fields.

A request runs on the model selected when it was queued (``POST /sdapi/v1/options``
``sd_model_checkpoint`` / ``sd_vae``), unless its ``override_settings`` name others: then on
those, and afterwards the selection is what it was (``override_settings_restore_afterwards``,
true by default), or the override becomes the selection (false). ``refiner_checkpoint`` names an
SDXL refiner from the same folders, which takes over at ``refiner_switch_at`` (a fraction of the
schedule, as the pipeline's ``refiner_switch_at``).

A1111 drops an override naming no model it knows; here it is an error, as is every other name
outside the folders (``sdkit_serve.catalog``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdkit.errors import InputError

if TYPE_CHECKING:
    from sdkit_serve.catalog import ModelCatalog

MODEL_SETTINGS = ("sd_model_checkpoint", "sd_vae")  # the override_settings keys this module takes
NO_REFINER = (None, "", "None", "none")  # A1111's values for "no refiner"


@dataclass(frozen=True)
class ModelChoice:
    """A checkpoint (its catalogue name) and an ``sd_vae`` value."""

    checkpoint: str
    vae: str = "Automatic"


@dataclass(frozen=True)
class ModelRequest:
    """What one generation request asks of the model: the choice it runs on, whether that
    choice becomes the selection afterwards, and its refiner."""

    choice: ModelChoice
    persist: bool = False
    refiner: str | None = None  # catalogue name
    refiner_switch_at: float | None = None
    ignored: dict[str, str] = field(default_factory=dict)


def override_choice(overrides: dict[str, Any], catalog: ModelCatalog, selected: ModelChoice) -> ModelChoice:
    """``selected`` with the overrides' ``sd_model_checkpoint`` (matched as A1111 matches it:
    an alias, else the shortest title containing it) and ``sd_vae``; an unknown name is an
    InputError."""
    checkpoint, vae = selected.checkpoint, selected.vae
    if overrides.get("sd_model_checkpoint") not in (None, ""):
        checkpoint = catalog.find(overrides["sd_model_checkpoint"], closest=True).name
    if overrides.get("sd_vae") not in (None, ""):
        vae = catalog.check_vae_option(overrides["sd_vae"])
    return ModelChoice(checkpoint, vae)


def model_request(payload: Any, catalog: ModelCatalog, selected: ModelChoice) -> ModelRequest:
    """The model part of a txt2img/img2img request (a pydantic model with A1111's fields as
    attributes or extra fields): checked now, before it waits in the queue."""
    data = payload.model_dump()
    overrides = data.get("override_settings") or {}
    if not isinstance(overrides, dict):
        raise InputError(f"override_settings must be an object, got {type(overrides).__name__}")
    choice = override_choice(overrides, catalog, selected)
    restore = data.get("override_settings_restore_afterwards", True)
    persist = restore is False and any(overrides.get(k) not in (None, "") for k in MODEL_SETTINGS)
    refiner_name, switch_at = data.get("refiner_checkpoint"), data.get("refiner_switch_at")
    refiner = None
    if refiner_name not in NO_REFINER:
        refiner = catalog.find(refiner_name, closest=True).name
        if switch_at is None or not isinstance(switch_at, (int, float)) or isinstance(switch_at, bool):
            raise InputError("refiner_checkpoint needs refiner_switch_at: the fraction of the steps before the refiner")
        if not 0.0 < float(switch_at) < 1.0:
            raise InputError(f"refiner_switch_at must be between 0 and 1 (exclusive), got {switch_at}")
    return ModelRequest(choice, persist, refiner, None if refiner is None else float(switch_at))
