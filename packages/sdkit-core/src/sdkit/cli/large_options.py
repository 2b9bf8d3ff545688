"""``sdkit generate``'s flags for large images, checked with the request before any model loads.

    --vae-tiling [--vae-tile-size 512]     (alias --tile: stable-diffusion.cpp's --vae-tiling)

The VAE decodes (and, for img2img and inpainting, encodes) in overlapping tiles of
``--vae-tile-size`` image pixels blended seam-free (``sdkit.pipelines.vae``), so a 2048 px image
decodes in the memory of a 512 px one.
"""

from __future__ import annotations

import argparse
from typing import Any

from sdkit.errors import InputError


def add_large_image_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("large images")
    group.add_argument(
        "--vae-tiling",
        "--tile",
        action="store_true",
        help="VAE decode/encode in overlapping tiles blended seam-free: large images in bounded memory",
    )
    group.add_argument(
        "--vae-tile-size",
        type=int,
        default=None,
        help="VAE tile side in image pixels, a multiple of 8 (default 512; overlap a quarter of it)",
    )


def large_image_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields of these flags (only those given, so the request's defaults hold)."""
    fields: dict[str, Any] = {}
    if args.vae_tile_size is not None and not args.vae_tiling:
        raise InputError("--vae-tile-size needs --vae-tiling")
    if args.vae_tiling:
        fields["vae_tiling"] = True
    if args.vae_tile_size is not None:
        fields["vae_tile_size"] = args.vae_tile_size
    return fields
