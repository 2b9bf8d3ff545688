"""``sdkit restore-faces IMAGE --model FILE -o OUT.png``: GFPGAN / CodeFormer face restoration.

As A1111 restores faces (``sdkit.pipelines.stages.faces``): RetinaFace finds the faces, each is
aligned to 512 x 512, restored, and pasted back through the face parser's mask. ``--model`` is a
GFPGAN or CodeFormer ``.safetensors`` file (which one is read from its tensors), or A1111's name
("GFPGAN", "CodeFormer") of one in ``--face-dir`` / ``$SDKIT_FACE_DIR``. The detector
(``detection_Resnet50_Final.safetensors``) and parser (``parsing_parsenet.safetensors``) are
taken from ``--detector`` / ``--parser``, else from those folders or the restorer's own.
``--fidelity`` is CodeFormer's weight ``w`` (0: strongest restoration, 1: closest to the input;
default 0.5; GFPGAN has none), ``--visibility`` A1111's Extras blend with the original.

Also here: ``sdkit generate``'s ``--restore-faces FILE [--codeformer-weight W]`` flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdkit.cli.common import add_backend_arguments, options_from
from sdkit.errors import InputError

HELP = "restore faces in an image with a GFPGAN or CodeFormer .safetensors file (as A1111 does)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", help="the image (PNG, JPEG, WebP...)")
    parser.add_argument("--model", "-m", required=True, help="GFPGAN / CodeFormer .safetensors file, or A1111's name")
    parser.add_argument(
        "--detector", default=None, help="RetinaFace file (default: detection_Resnet50_Final in the face folders)"
    )
    parser.add_argument("--parser", default=None, help="ParseNet file (default: parsing_parsenet in the face folders)")
    parser.add_argument(
        "--no-parse",
        action="store_true",
        help="paste with facexlib's square mask instead of the parse mask (no parser)",
    )
    parser.add_argument("--fidelity", type=float, default=None, help="CodeFormer's weight w in [0, 1] (default 0.5)")
    parser.add_argument("--visibility", type=float, default=1.0, help="blend with the original, 0-1 (default 1)")
    parser.add_argument("--output", "-o", required=True, help="the PNG to write (refused if it exists, unless --force)")
    parser.add_argument("--force", action="store_true", help="overwrite --output")
    parser.add_argument("--face-dir", action="append", default=[], help="folder of face model files (repeatable)")
    add_backend_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from sdkit.pipelines.stages.faces import load_face_models, restore_faces_with
    from sdkit.pipelines.stages.upscaler import opened_image

    output = Path(args.output)
    if output.exists() and not args.force:
        raise InputError(f"{output} exists; use --force to overwrite it")
    if args.no_parse and args.parser is not None:
        raise InputError("--parser and --no-parse exclude each other")
    options = options_from(args)
    if options:
        raise InputError(f"backend options are not taken by face restoration: {', '.join(options)}")
    image = opened_image(args.image)
    models = load_face_models(
        args.model,
        detector=args.detector,
        parser=args.parser,
        use_parse=not args.no_parse,
        backend=args.backend,
        device=args.device,
        folders=args.face_dir,
    )
    result, count = restore_faces_with(image, models, args.fidelity, args.visibility)
    output.parent.mkdir(parents=True, exist_ok=True)
    result.save(output)
    print(f"{output}: {count} face(s) restored with {models.name}")
    return 0


def add_face_arguments(parser: argparse.ArgumentParser) -> None:
    """``sdkit generate``'s face restoration flags."""
    group = parser.add_argument_group("face restoration (A1111's restore_faces)")
    group.add_argument(
        "--restore-faces",
        default=None,
        metavar="FILE",
        help="GFPGAN / CodeFormer .safetensors file (or A1111's name in $SDKIT_FACE_DIR) run on every image",
    )
    group.add_argument(
        "--codeformer-weight", type=float, default=None, help="CodeFormer's fidelity w in [0, 1] (default 0.5)"
    )


def face_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields of those flags (only those given)."""
    fields: dict[str, Any] = {}
    if getattr(args, "restore_faces", None) is not None:
        fields["restore_faces"] = args.restore_faces
    if getattr(args, "codeformer_weight", None) is not None:
        if "restore_faces" not in fields:
            raise InputError("--codeformer-weight needs --restore-faces")
        fields["codeformer_weight"] = args.codeformer_weight
    return fields
