"""Face restoration on the server: A1111's ``restore_faces`` and the Extras' GFPGAN / CodeFormer.

The server restores faces when started with ``--face-dir`` (or ``$SDKIT_FACE_DIR``): a folder
holding A1111's files as ``.safetensors`` (``GFPGANv1.4``, ``codeformer-v0.1.0``, and the
``detection_Resnet50_Final`` detector and ``parsing_parsenet`` parser they run with;
``sdkit.pipelines.stages.faces``). Then:

- txt2img / img2img ``restore_faces: true`` restores every image after decoding, with A1111's
  setting ``face_restoration_model`` ("CodeFormer", A1111's default, or "GFPGAN"; the server's
  ``--face-restoration-model``, ``POST /sdapi/v1/options``, or per request in
  ``override_settings``) and, for CodeFormer, ``code_former_weight`` (0.5 unless set the same
  ways); the PNG says ``Face restoration: ...``.
- Extras: ``gfpgan_visibility`` and then ``codeformer_visibility`` (with ``codeformer_weight``)
  above 0 restore after the upscaling, blended with the image at that visibility, as A1111's
  postprocessing scripts run (Upscale, GFPGAN, CodeFormer).

Without a face folder, or without the file a request needs, the request is refused (400) naming
the field: never silently left unrestored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.errors import InputError

RESTORER_FILES = {"GFPGAN": "GFPGANv1.4", "CodeFormer": "codeformer-v0.1.0"}  # A1111's names
DEFAULT_RESTORER = "CodeFormer"  # A1111's face_restoration_model default
DEFAULT_CODEFORMER_WEIGHT = 0.5  # A1111's code_former_weight default
FACE_SETTINGS = ("face_restoration_model", "code_former_weight")


@dataclass(frozen=True)
class FaceSettings:
    """The server's face folder and A1111's two settings (``--face-restoration-model``,
    ``--code-former-weight``)."""

    face_dir: Path | None = None
    model: str | None = None  # None: CodeFormer if its file is there, else GFPGAN
    code_former_weight: float = DEFAULT_CODEFORMER_WEIGHT


def face_option_ok(key: str, value: Any) -> bool:
    """Whether ``POST /sdapi/v1/options`` may keep this face setting (A1111's names and values)."""
    if key == "face_restoration_model":
        return value in RESTORER_FILES
    if key == "code_former_weight":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value) and 0.0 <= value <= 1.0
    return False


def restorer_files(face_dir: Path | None) -> dict[str, Path]:
    """A1111's restorer name -> its ``.safetensors`` file in ``face_dir`` (those present)."""
    if face_dir is None:
        return {}
    found = {}
    for name, stem in RESTORER_FILES.items():
        path = Path(face_dir) / f"{stem}.safetensors"
        if path.is_file():
            found[name] = path
    return found


def _restorer(name: str, face_dir: Path | None, field: str) -> Path:
    files = restorer_files(face_dir)
    canonical = next((n for n in RESTORER_FILES if n.lower() == str(name).lower()), None)
    if canonical is None:
        raise InputError(f"{field}: unknown face restorer {name!r}; A1111's are GFPGAN and CodeFormer")
    if canonical not in files:
        have = ", ".join(files) or "none"
        where = "its --face-dir" if face_dir is not None else "no --face-dir"
        raise InputError(
            f"{field}: this server has no {canonical} face restorer ({where}; {RESTORER_FILES[canonical]}.safetensors "
            f"expected; restorers here: {have})"
        )
    return files[canonical]


def _weight(value: Any, field: str) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{field} must be a number in [0, 1], got {value!r}") from None
    if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
        raise InputError(f"{field} must be in [0, 1], got {value!r}")
    return weight


def generation_fields(
    restore: bool | None, overrides: dict[str, Any] | None, settings: FaceSettings | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(pipeline.generate fields, ignored)`` of a request's ``restore_faces`` and its
    ``override_settings`` face keys; an InputError naming the field when it cannot be honoured."""
    settings = settings or FaceSettings()
    face_dir, default_model, default_weight = settings.face_dir, settings.model, settings.code_former_weight
    overrides = {k: v for k, v in (overrides or {}).items() if k in FACE_SETTINGS}
    if not restore:
        ignored = {f"override_settings.{k}": "applies with restore_faces: true" for k in overrides}
        return {}, ignored
    if face_dir is None or not restorer_files(face_dir):
        raise InputError(
            "restore_faces: this server has no face restorer; start it with --face-dir holding "
            "GFPGANv1.4.safetensors and/or codeformer-v0.1.0.safetensors (with detection_Resnet50_Final and "
            "parsing_parsenet .safetensors)"
        )
    if "face_restoration_model" in overrides:
        name, field = str(overrides["face_restoration_model"]), "override_settings.face_restoration_model"
    else:
        name, field = default_model or _default(face_dir), "restore_faces"
    path = _restorer(name, face_dir, field)
    fields: dict[str, Any] = {"restore_faces": str(path)}
    if path.stem == RESTORER_FILES["CodeFormer"]:
        weight = overrides.get("code_former_weight", default_weight)
        fields["codeformer_weight"] = _weight(weight, "override_settings.code_former_weight")
        return fields, {}
    ignored = {}
    if "code_former_weight" in overrides:
        ignored["override_settings.code_former_weight"] = "applies to CodeFormer, not GFPGAN"
    return fields, ignored


def _default(face_dir: Path | None) -> str:
    files = restorer_files(face_dir)
    return DEFAULT_RESTORER if DEFAULT_RESTORER in files else next(iter(files), DEFAULT_RESTORER)


class ExtrasFaces:
    """The Extras' GFPGAN and CodeFormer steps of one request (checked when it comes)."""

    def __init__(self, payload: Any, face_dir: Path | None) -> None:
        self.steps: list[tuple[str, Path, float | None, float]] = []
        if payload.gfpgan_visibility > 0:
            self.steps.append(
                ("GFPGAN", _restorer("GFPGAN", face_dir, "gfpgan_visibility"), None, payload.gfpgan_visibility)
            )
        if payload.codeformer_visibility > 0:
            path = _restorer("CodeFormer", face_dir, "codeformer_visibility")
            self.steps.append(("CodeFormer", path, payload.codeformer_weight, payload.codeformer_visibility))

    def run(self, image: Any, backend: str, device: str | None, check: Any) -> Any:
        from sdkit.pipelines.stages.faces import load_face_models, restore_faces_with

        for _, path, weight, visibility in self.steps:
            check()
            models = load_face_models(path, backend=backend, device=device)
            image, _ = restore_faces_with(image, models, weight, visibility)
        return image

    def info(self) -> list[str]:
        """A1111's postprocessing labels (values rounded to 3 places, as its scripts write them)."""
        parts = []
        for name, _, weight, visibility in self.steps:
            parts.append(f"{name} visibility: {round(visibility, 3):g}")
            if weight is not None:
                parts.append(f"{name} weight: {round(weight, 3):g}")
        return parts
