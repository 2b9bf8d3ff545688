"""``sdkit generate``'s flags for large images, checked with the request before any model loads.

    --vae-tiling [--vae-tile-size 512]     (alias --tile: stable-diffusion.cpp's --vae-tiling)
    --hires [--hr-scale 2] [--hr-upscaler Latent] [--hr-steps 0] [--denoising-strength 0.7]
            [--hr-resize-x W] [--hr-resize-y H]      (A1111's hires fix, txt2img only)

The VAE decodes (and, for img2img and inpainting, encodes) in overlapping tiles of
``--vae-tile-size`` image pixels blended seam-free (``sdkit.pipelines.stages.vae``), so a 2048 px image
decodes in the memory of a 512 px one. ``--hires`` is A1111's hires fix
(``sdkit.pipelines.features.hires_fix``), its flags A1111's API fields (``enable_hr``, ``hr_scale``,
``hr_upscaler``, ``hr_second_pass_steps``, ``hr_resize_x/y``, ``denoising_strength``).
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

    hires = parser.add_argument_group("hires fix (A1111's)")
    hires.add_argument("--hires", action="store_true", help="hires fix: generate, upscale, img2img at the larger size")
    hires.add_argument("--hr-scale", type=float, default=None, help="upscale factor (default 2)")
    hires.add_argument(
        "--hr-upscaler",
        default=None,
        help="Latent, Latent (nearest), Latent (nearest-exact), Lanczos or Nearest (default Latent)",
    )
    hires.add_argument("--hr-steps", type=int, default=None, help="second-pass steps (default 0: --steps)")
    hires.add_argument("--hr-resize-x", type=int, default=None, help="resize to this width instead of --hr-scale")
    hires.add_argument("--hr-resize-y", type=int, default=None, help="resize to this height instead of --hr-scale")
    hires.add_argument(
        "--denoising-strength", type=float, default=None, help="the second pass's denoising strength (default 0.7)"
    )


HIRES_FLAGS = {
    "hr_scale": "hr_scale",
    "hr_upscaler": "hr_upscaler",
    "hr_steps": "hr_second_pass_steps",
    "hr_resize_x": "hr_resize_x",
    "hr_resize_y": "hr_resize_y",
    "denoising_strength": "denoising_strength",
}


def large_image_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields of these flags (only those given, so the request's defaults hold)."""
    fields: dict[str, Any] = {}
    if args.vae_tile_size is not None and not args.vae_tiling:
        raise InputError("--vae-tile-size needs --vae-tiling")
    if args.vae_tiling:
        fields["vae_tiling"] = True
    if args.vae_tile_size is not None:
        fields["vae_tile_size"] = args.vae_tile_size
    given = {field: getattr(args, flag) for flag, field in HIRES_FLAGS.items() if getattr(args, flag) is not None}
    if given and not args.hires:
        flag = next(flag for flag, field in HIRES_FLAGS.items() if field in given)
        raise InputError(f"--{flag.replace('_', '-')} needs --hires")
    if args.hires:
        fields.update(enable_hr=True, **given)
    return fields
