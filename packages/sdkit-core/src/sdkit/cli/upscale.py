"""``sdkit upscale IMAGE --model FILE [--scale N] -o OUT.png``: an ESRGAN / Real-ESRGAN upscaler.

``--model`` is a ``.safetensors`` file (architecture and layout detected from its keys), or
A1111's name ("R-ESRGAN 4x+") or a file stem of one in ``--upscaler-dir`` /
``$SDKIT_UPSCALER_DIR``. ``--scale`` follows A1111 (target ``int(size * scale) // 8 * 8``, the
model run up to 3 times, then Lanczos); without it the model's own scale. The image runs in
``--tile`` pixel tiles overlapping by ``--overlap`` (0: the whole image at once).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sdkit.cli.common import add_backend_arguments, options_from
from sdkit.errors import InputError

HELP = "upscale an image with an ESRGAN / Real-ESRGAN .safetensors file (tiled, any backend)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", help="the image to upscale (PNG, JPEG, WebP...)")
    parser.add_argument("--model", "-m", required=True, help="upscaler .safetensors file, A1111 name or file stem")
    parser.add_argument("--scale", type=float, default=None, help="upscale factor (default: the model's)")
    parser.add_argument("--output", "-o", required=True, help="the PNG to write (refused if it exists, unless --force)")
    parser.add_argument("--force", action="store_true", help="overwrite --output")
    parser.add_argument("--tile", type=int, default=192, help="tile size in input pixels, 0: none (default: 192)")
    parser.add_argument("--overlap", type=int, default=16, help="tile overlap in input pixels (default: 16)")
    parser.add_argument(
        "--upscaler-dir", action="append", default=[], help="folder of upscaler files for names (repeatable)"
    )
    add_backend_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from sdkit.pipelines.stages.upscaler import load_upscaler, opened_image

    output = Path(args.output)
    if output.exists() and not args.force:
        raise InputError(f"{output} exists; use --force to overwrite it")
    options = options_from(args)
    upscaler = load_upscaler(
        args.model,
        args.backend,
        args.device,
        folders=args.upscaler_dir,
        tile=args.tile,
        overlap=args.overlap,
        **options,
    )
    result = upscaler.upscale(opened_image(args.image), args.scale)
    output.parent.mkdir(parents=True, exist_ok=True)
    result.save(output)
    print(f"{output}: {result.width}x{result.height} ({upscaler.config.describe()}, {upscaler.backend})")
    return 0
