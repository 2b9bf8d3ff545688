"""``sdkit merge A B [C] --mode weighted-sum|add-difference --alpha M -o OUT.safetensors``.

A1111's Checkpoint Merger (``sdkit.families.merge``): ``A * (1 - M) + B * M`` or
``A + (B - C) * M``, tensor by tensor; ``--vae FILE`` bakes a VAE in, ``--keep-vae`` keeps A's;
``--lora FILE[:STRENGTH]`` (repeatable) bakes LoRAs in (A alone: a LoRA baked into A);
``--dtype fp32`` (every float tensor) or ``fp16`` (the merged ones, as A1111's "save as
float16"; default: each tensor as A stores it). The output is one ``.safetensors``
file that loads as any other checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sdkit.errors import InputError

HELP = "merge checkpoints as A1111 does (weighted sum, add difference), bake a VAE or LoRAs in"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoints", nargs="+", metavar="A [B [C]]", help="single-file .safetensors checkpoints")
    parser.add_argument(
        "--mode",
        choices=("weighted-sum", "add-difference"),
        default=None,
        help="weighted-sum (A, B) or add-difference (A, B, C); default: by the number of files",
    )
    parser.add_argument("--alpha", "-M", type=float, default=0.5, help="multiplier M (default: 0.5)")
    parser.add_argument("--output", "-o", required=True, help="the .safetensors to write")
    parser.add_argument("--force", action="store_true", help="overwrite --output")
    parser.add_argument(
        "--dtype",
        choices=("fp16", "fp32"),
        default=None,
        help="fp32: every float tensor; fp16: the merged ones, as A1111's 'save as float16' (default: A's dtypes)",
    )
    vae = parser.add_mutually_exclusive_group()
    vae.add_argument("--vae", default=None, help="a VAE .safetensors (LDM keys) to bake in")
    vae.add_argument("--keep-vae", action="store_true", help="keep A's VAE unmerged")
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:STRENGTH]",
        help="a LoRA to bake in at a strength (default 1), repeatable",
    )


def run(args: argparse.Namespace) -> int:
    from sdkit.families.merge import merge_checkpoints, parse_lora
    from sdkit.plugins import get_plugins

    files = list(args.checkpoints)
    if len(files) > 3:
        raise InputError(f"sdkit merge takes A, B and at most C; got {len(files)} files")
    mode = args.mode or ("add-difference" if len(files) == 3 else "weighted-sum")
    output = Path(args.output)
    if output.exists() and not args.force:
        raise InputError(f"{output} exists; use --force to overwrite it")
    loras = [parse_lora(text) for text in args.lora]
    report = merge_checkpoints(
        files[0],
        files[1] if len(files) > 1 else None,
        files[2] if len(files) > 2 else None,
        output=output,
        mode=mode,
        alpha=args.alpha,
        dtype=args.dtype,
        vae=args.vae,
        keep_vae=args.keep_vae,
        loras=loras,
        families=get_plugins().families.families() if loras else (),
    )
    print(report.summary())
    return 0
