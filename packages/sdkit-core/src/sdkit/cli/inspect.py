"""``sdkit inspect FILE``: what a ``.safetensors`` file (or a diffusers folder) is, from its header.

A checkpoint: its family, layout, dtypes, parameters per component, EMA, prediction type; a LoRA:
format, rank, targets; an embedding: vectors and width; a VAE; anything else: its top-level keys.
A ``.gguf`` file (stable-diffusion.cpp's and llama.cpp's format): the family its tensor names say,
its quantization (the type of most of its matrices) and the count of each tensor type
(``sdkit.families.gguf_reader``). Only the header is read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sdkit.families import Checkpoint, describe, gguf_reader
from sdkit.families.inspect import FileDescription
from sdkit.plugins import get_plugins

HELP = (
    "say what a .safetensors file is: checkpoint (family, dtype, parameters), LoRA, embedding, VAE; "
    "a .gguf file: family and quantization"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a .safetensors or .gguf file, or a diffusers folder")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if gguf_reader.is_gguf(Path(args.file)):
        return inspect_gguf(args)
    checkpoint = Checkpoint.open(args.file)
    description = describe(checkpoint, get_plugins().families.families())
    if description.kind == "unknown" and checkpoint.path.is_file():
        description = engine_only(checkpoint, description)
    if args.json:
        print(json.dumps({"file": str(checkpoint.path), **description.as_dict()}, indent=2))
    else:
        print(f"{checkpoint.path.name}: " + "\n".join(description.lines()))
    return 0


def engine_only(checkpoint: Checkpoint, description: FileDescription) -> FileDescription:
    """A file of a family only stable-diffusion.cpp runs (Wan, Qwen-Image, Z-Image, FLUX.2...),
    named from its tensor names as ``gguf_reader.family_of`` does for a GGUF file."""
    from sdkit.families.safetensors_reader import SafetensorsFile

    entries = SafetensorsFile(checkpoint.path).entries
    family = gguf_reader.family_of({name: tuple(entry.shape) for name, entry in entries.items()})
    if family == "unknown":
        return description
    details = [("runs on", "stable-diffusion.cpp (sdkit-sdcpp: sdkit generate --backend sdcpp --model FILE)")]
    return FileDescription("checkpoint", f"{family} (tensor names)", details + description.details)


def inspect_gguf(args: argparse.Namespace) -> int:
    header = gguf_reader.read_header(args.file)
    header.check_complete()  # a truncated download, or sizes and offsets past the file's end
    counts = dict(header.type_counts().most_common())
    parameters = sum(int(np.prod(t.shape, dtype=np.int64)) for t in header.tensors)
    found = {
        "format": f"GGUF v{header.version}",
        "family": header.family,
        "quantization": header.quantization,
        "tensor_types": counts,
        "tensors": len(header.tensors),
        "parameters": parameters,
    }
    if args.json:
        print(json.dumps({"file": str(header.path), **found}, indent=2))
        return 0
    types = ", ".join(f"{name} {count}" for name, count in counts.items())
    print(f"{header.path.name}: {found['format']}, {header.family}, quantization {header.quantization}")
    print(f"  {len(header.tensors)} tensors ({types}), {parameters / 1e6:.1f}M parameters")
    print("  runs on stable-diffusion.cpp (sdkit-sdcpp: sdkit generate --model FILE)")
    return 0
