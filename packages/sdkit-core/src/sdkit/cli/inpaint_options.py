"""``sdkit generate``'s inpainting and ControlNet flags, checked before any model loads.

    --mask mask.png [--mask-blur 4] [--inpaint-full-res [--inpaint-full-res-padding 32]] [--paste-back]
    --control IMAGE:MODEL[:SCALE[:START[:END]]][:PREPROCESSOR]      (repeatable)

``--control edges.png:models/control_canny:0.8`` uses the ControlNet folder ``models/control_canny``
(``model.onnx`` + ``config.json``) at scale 0.8 on ``edges.png``; ``photo.png:models/control_canny:
1:0:0.6:canny`` runs the canny preprocessor on ``photo.png`` first and stops the ControlNet after
60% of the steps. A field that is not a number is the preprocessor (``none`` for none). Each
folder loads once, named by its folder name, whatever the number of ``--control`` flags using it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdkit.errors import InputError
from sdkit.pipelines.features.controlnet import read_controlnet

CONTROL_HELP = (
    "ControlNet unit IMAGE:MODEL[:SCALE[:START[:END]]][:PREPROCESSOR] (MODEL: a ControlNet folder; "
    "PREPROCESSOR: canny, invert, threshold, tile_resample, blur_gaussian, scribble_xdog); repeatable"
)


def add_inpaint_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("inpainting and ControlNet")
    group.add_argument("--mask", default=None, help="inpainting mask (white repaints), the --init-image's size")
    group.add_argument("--mask-blur", type=int, default=0, help="A1111's mask blur in pixels (default 0; A1111's: 4)")
    group.add_argument(
        "--inpaint-full-res", action="store_true", help='A1111\'s "only masked": generate a crop around the mask'
    )
    group.add_argument(
        "--inpaint-full-res-padding", type=int, default=32, help="pixels around the mask in the crop (default 32)"
    )
    group.add_argument(
        "--paste-back",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="blend the result into the original under the mask, as A1111 (default: only with --inpaint-full-res)",
    )
    group.add_argument("--control", action="append", default=[], metavar="IMAGE:MODEL[:SCALE...]", help=CONTROL_HELP)


def parse_control(text: str) -> tuple[dict[str, Any], str]:
    """One ``--control`` value as a ControlNet unit (the model named by its folder) and the
    folder's path."""
    parts = text.split(":")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise InputError(f"--control expects IMAGE:MODEL[:SCALE[:START[:END]]][:PREPROCESSOR], got {text!r}")
    image, model, rest = parts[0], parts[1], parts[2:]
    numbers: list[float] = []
    preprocessor = None
    for index, field in enumerate(rest):
        try:
            numbers.append(float(field))
        except ValueError:
            if index != len(rest) - 1:
                raise InputError(f"--control {text!r}: the preprocessor ({field!r}) comes last") from None
            preprocessor = field
    if len(numbers) > 3:
        raise InputError(f"--control {text!r}: at most SCALE, START and END follow the model")
    unit: dict[str, Any] = dict(zip(("scale", "start", "end"), numbers, strict=False))
    unit.update(image=image, model=_name(model), preprocessor=preprocessor)
    return unit, model


def _name(path: str) -> str:
    location = Path(path)
    return location.parent.name if location.suffix == ".onnx" else location.name


def control_fields(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The request fields of the inpainting and ControlNet flags, and ``{name: folder}`` of the
    ControlNets to load (each folder read here, so a missing one fails before the model loads)."""
    units: list[dict[str, Any]] = []
    folders: dict[str, str] = {}
    for text in args.control:
        unit, folder = parse_control(text)
        known = folders.setdefault(unit["model"], folder)
        if Path(known).resolve() != Path(folder).resolve():
            raise InputError(f"--control: two ControlNet folders are named {unit['model']!r}: {known} and {folder}")
        units.append(unit)
    for folder in folders.values():
        read_controlnet(folder)
    fields: dict[str, Any] = {
        "mask": args.mask,
        "mask_blur": args.mask_blur,
        "inpaint_full_res": args.inpaint_full_res,
        "inpaint_full_res_padding": args.inpaint_full_res_padding,
        "paste_back": args.paste_back,
    }
    if units:
        fields["control"] = units
    return fields, folders
