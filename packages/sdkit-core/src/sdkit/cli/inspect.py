"""``sdkit inspect FILE``: what a ``.safetensors`` file (or a diffusers folder) is, from its header.

A checkpoint: its family, layout, dtypes, parameters per component, EMA, prediction type; a LoRA:
format, rank, targets; an embedding: vectors and width; a VAE; anything else: its top-level keys.
Only the header is read.
"""

from __future__ import annotations

import argparse
import json

from sdkit.families import Checkpoint, describe
from sdkit.plugins import get_plugins

HELP = "say what a .safetensors file is: checkpoint (family, dtype, parameters), LoRA, embedding, VAE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a .safetensors file or a diffusers folder")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    checkpoint = Checkpoint.open(args.file)
    description = describe(checkpoint, get_plugins().families.families())
    if args.json:
        print(json.dumps({"file": str(checkpoint.path), **description.as_dict()}, indent=2))
    else:
        print(f"{checkpoint.path.name}: " + "\n".join(description.lines()))
    return 0
