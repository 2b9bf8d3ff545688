"""``sdkit generate``'s SDXL flags (second prompts, micro-conditioning, refiner) and their checks.

Everything here runs before a model loads: the pipeline class comes from the model's config files
(``sdkit.pipelines.loaders.loading.pipeline_class_for``), so ``--prompt-2`` on an SD 1.x model or a
``--refiner`` that is not SDXL fails in a second with one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdkit.errors import InputError
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.pipelines.models.base import Pipeline
from sdkit.pipelines.request import PROMPT_WEIGHTINGS

SIZE_HELP = "WIDTHxHEIGHT (A1111's Size order; diffusers' (height, width) inside)"


def add_sdxl_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SDXL")
    group.add_argument("--prompt-2", default=None, help="prompt for the second text encoder (default: the prompt)")
    group.add_argument("--negative-2", default=None, help="negative prompt for the second text encoder")
    group.add_argument("--original-size", default=None, metavar="WxH", help=f"time_ids original size, {SIZE_HELP}")
    group.add_argument("--target-size", default=None, metavar="WxH", help=f"time_ids target size, {SIZE_HELP}")
    group.add_argument("--crop-top", type=int, default=None, help="time_ids crop top (default: 0)")
    group.add_argument("--crop-left", type=int, default=None, help="time_ids crop left (default: 0)")
    group.add_argument("--aesthetic-score", type=float, default=None, help="refiner's aesthetic score (default: 6)")
    group.add_argument(
        "--negative-aesthetic-score", type=float, default=None, help="refiner's negative aesthetic score (default: 2.5)"
    )
    group.add_argument("--refiner", default=None, metavar="PATH", help="an SDXL refiner that finishes the image")
    group.add_argument(
        "--refiner-switch-at",
        "--refiner-switch",
        type=float,
        default=None,
        help="fraction of the noise schedule the base runs before the refiner takes over (default: 0.8)",
    )
    parser.add_argument(
        "--prompt-weighting",
        choices=PROMPT_WEIGHTINGS,
        default="none",
        help="none: the prompt as written, cut at 75 tokens (diffusers); a1111: (word:1.2) emphasis, "
        "75-token chunks, BREAK (default: %(default)s)",
    )
    parser.add_argument(
        "--clip-skip",
        type=int,
        default=1,
        metavar="N",
        help="A1111's clip skip: the text encoder's hidden states N - 1 layers before the usual ones "
        "(1: the usual; 2: one layer earlier; default: %(default)s)",
    )


def _size(text: str, flag: str) -> tuple[int, int]:
    """``WxH`` -> ``(H, W)``, the order diffusers' fields take."""
    width, sep, height = text.lower().partition("x")
    if not sep or not width.strip().isdigit() or not height.strip().isdigit():
        raise InputError(f"{flag} expects WIDTHxHEIGHT, e.g. 1024x1024, got {text!r}")
    return int(height), int(width)


def sdxl_fields(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The SDXL request fields the flags set: field -> (flag, value)."""
    fields: dict[str, tuple[str, Any]] = {}
    simple = (
        ("prompt_2", "--prompt-2"),
        ("negative_prompt_2", "--negative-2"),
        ("aesthetic_score", "--aesthetic-score"),
        ("negative_aesthetic_score", "--negative-aesthetic-score"),
        ("refiner_switch_at", "--refiner-switch-at"),
    )
    for field, flag in simple:
        value = getattr(args, field if field != "negative_prompt_2" else "negative_2")
        if value is not None:
            fields[field] = (flag, value)
    for field, flag in (("original_size", "--original-size"), ("target_size", "--target-size")):
        text = getattr(args, field)
        if text is not None:
            fields[field] = (flag, _size(text, flag))
    if args.crop_top is not None or args.crop_left is not None:
        fields["crops_coords_top_left"] = ("--crop-top/--crop-left", (args.crop_top or 0, args.crop_left or 0))
    if args.refiner is not None:
        fields["refiner"] = ("--refiner", None)  # the pipeline is loaded later: checked here, set then
    return fields


def checked_fields(args: argparse.Namespace, pipeline_class: type[Pipeline]) -> dict[str, Any]:
    """The SDXL fields as request keywords, refused when the model's pipeline lacks them, and a
    ``--refiner`` that is not an SDXL pipeline folder refused, before any model loads."""
    fields = sdxl_fields(args)
    known = pipeline_class.request_class.field_names()
    for field, (flag, _) in fields.items():
        if field not in known:
            raise InputError(f"{flag} needs an SDXL model; {Path(args.model).name} is a {pipeline_class.__name__}")
    if args.refiner is not None:
        if not Path(args.refiner).expanduser().exists():
            raise InputError(f"--refiner: {args.refiner} not found")
        refiner_class = pipeline_class_for(args.refiner)
        if refiner_class is None or "refiner" not in refiner_class.request_class.field_names():
            kind = refiner_class.__name__ if refiner_class else "not a pipeline sdkit can tell"
            raise InputError(f"--refiner must be an SDXL model; {Path(args.refiner).name} is {kind}")
    return {field: value for field, (_, value) in fields.items() if field != "refiner"}
