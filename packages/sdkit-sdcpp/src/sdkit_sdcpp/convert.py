"""``sdkit convert MODEL --to gguf --type q4_K``: a checkpoint to a (quantized) GGUF file, through
stable-diffusion.cpp's own converter (its ``convert()``, what ``sd -M convert`` runs), so the file
is exactly what sd.cpp writes and reads.

A subcommand of the ``sdkit`` CLI through the ``sdkit.cli`` entry-point group. Importing this
module imports no binding (the CLI imports it to build its parser).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.families import gguf_reader
from sdkit_sdcpp import binding
from sdkit_sdcpp.engine import capture_log, last_errors, silence_progress

HELP = "convert a checkpoint to a GGUF file (f16, q8_0, q5_0, q4_0, q4_K...) with stable-diffusion.cpp"
# The output types sd.cpp's converter writes (its ``sd_type_t`` names; K-quants in upper case K).
TYPES = ("f32", "f16", "bf16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
INPUTS = (".safetensors", ".sft", ".gguf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .safetensors checkpoint (or a .gguf file to re-quantize)")
    parser.add_argument("--to", default="gguf", choices=("gguf",), help="the output format (default: gguf)")
    parser.add_argument("--type", default="q8_0", help=f"the weights' type: {', '.join(TYPES)} (default: q8_0)")
    parser.add_argument("-o", "--output", default=None, help="the .gguf file to write (default: MODEL-TYPE.gguf)")
    parser.add_argument("--vae", default=None, help="a VAE file to put in the output instead of the model's")
    parser.add_argument(
        "--tensor-type-rules", default="", help="per-tensor types, sd.cpp's syntax: '^vae\\.=f16,model\\.=q8_0'"
    )
    parser.add_argument("--force", action="store_true", help="overwrite the output file")


def output_type(name: str) -> str:
    """``name`` as sd.cpp's type name, or an ``OptionError`` listing them."""
    found = next((t for t in TYPES if t.lower() == name.strip().lower()), None)
    if found is None:
        raise OptionError(f"--type {name!r}: stable-diffusion.cpp's converter writes {', '.join(TYPES)}")
    return found


def convert_to_gguf(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    kind: str = "q8_0",
    vae: str | os.PathLike[str] | None = None,
    rules: str = "",
) -> Path:
    """Write ``model`` as a GGUF file of ``kind`` weights at ``output`` (sd.cpp's converter)."""
    source, target = Path(model).expanduser(), Path(output).expanduser()
    if not source.is_file():
        raise InputError(f"no such file: {source}")
    if source.suffix.lower() not in INPUTS:
        raise InputError(f"{source.name}: the converter is given .safetensors or .gguf files (pickles are refused)")
    if vae is not None and not Path(vae).is_file():
        raise InputError(f"--vae: no such file: {vae}")
    if target.suffix.lower() != ".gguf":
        raise InputError(f"{target.name}: the output is a .gguf file")
    module = binding.import_binding()
    from stable_diffusion_cpp.stable_diffusion import GGML_TYPE_MAP

    code = GGML_TYPE_MAP[output_type(kind).lower()]
    capture_log()
    silence_progress()
    done = module.convert(
        str(source).encode(), str(vae or "").encode(), str(target).encode(), int(code), rules.encode(), False
    )
    if not done or not gguf_reader.is_gguf(target):
        raise ModelFormatError(f"stable-diffusion.cpp could not convert {source.name}{last_errors()}")
    return target


def run(args: argparse.Namespace) -> int:
    kind = output_type(args.type)
    source = Path(args.model).expanduser()
    target = Path(args.output) if args.output else source.with_name(f"{source.stem}-{kind}.gguf")
    if target.exists() and not args.force:
        raise InputError(f"{target} exists: pass --force to overwrite it")
    convert_to_gguf(source, target, kind, args.vae, args.tensor_type_rules)
    header = gguf_reader.read_header(target)
    size = target.stat().st_size / 1e6
    print(f"wrote {target} ({size:.0f} MB): {header.family}, quantization {header.quantization}")
    return 0
