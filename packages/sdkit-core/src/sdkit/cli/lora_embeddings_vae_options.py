"""The ``sdkit generate`` flags for LoRAs, embeddings and a VAE file, as A1111 users know them:
``--lora PATH[:STRENGTH]`` (repeatable), ``--lora-dir DIR`` for the prompt's
``<lora:name:0.8>`` tags (the tags stay in the prompt and the PNG's parameters, as A1111 keeps
them, and are no text for the encoder), ``--embedding FILE`` (repeatable; triggered by the file's
name in the prompt), ``--vae FILE``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdkit.errors import InputError
from sdkit.pipelines.features.lora_embeddings_vae import LORA_TAG, prompt_loras


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="PATH[:STRENGTH]",
        help="a LoRA .safetensors file (kohya/LoCon, PEFT, diffusers) and its strength (default 1); repeatable",
    )
    parser.add_argument(
        "--lora-dir",
        default=None,
        metavar="DIR",
        help="where the prompt's <lora:name:strength> tags find name.safetensors (sub-folders too)",
    )
    parser.add_argument(
        "--embedding",
        action="append",
        default=[],
        metavar="FILE",
        help="a textual-inversion .safetensors file, triggered by its file name in the prompt; repeatable",
    )
    parser.add_argument(
        "--vae",
        default=None,
        metavar="FILE",
        help="a standalone VAE .safetensors file (LDM or diffusers keys); "
        "with --clip_l/--clip_g/--t5xxl, the Flux, Chroma or SD3 model's VAE file (ae.safetensors)",
    )
    parser.add_argument(
        "--clip_l",
        default=None,
        metavar="FILE",
        help="a Flux or SD3 --model's CLIP-L text encoder when the file lacks it (ComfyUI's clip_l.safetensors)",
    )
    parser.add_argument(
        "--clip_g",
        default=None,
        metavar="FILE",
        help="an SD3 --model's OpenCLIP bigG text encoder when the file lacks it (ComfyUI's clip_g.safetensors)",
    )
    parser.add_argument(
        "--t5xxl",
        default=None,
        metavar="FILE",
        help="a Flux, Chroma or SD3 --model's T5-XXL text encoder when the file lacks it (t5xxl_fp16.safetensors)",
    )
    add_engine_file_arguments(parser)


ENGINE_FILES = ("clip_vision", "high_noise_diffusion_model", "photo_maker")
ENGINE_FILE_HELP = {
    "--llm": "a FLUX.2, Qwen-Image or Z-Image --model's language-model text encoder (stable-diffusion.cpp)",
    "--clip_vision": "a Wan2.1 I2V --model's CLIP vision encoder (stable-diffusion.cpp)",
    "--high-noise-diffusion-model": "a Wan2.2 14B model's high-noise expert (stable-diffusion.cpp)",
    "--photo-maker": "an SDXL model's PhotoMaker file (stable-diffusion.cpp; with --pm-id-images-dir)",
}


def add_engine_file_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, text in ENGINE_FILE_HELP.items():
        parser.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None, metavar="FILE", help=text)


def component_files(args: argparse.Namespace) -> dict[str, str]:
    """The component files a transformer-only --model takes at load (stable-diffusion.cpp's
    --clip_l, --clip_g, --t5xxl, --vae): given one of the text encoders, --vae is that model's
    VAE file."""
    files = {
        name: str(path)
        for name in ("clip_l", "clip_g", "t5xxl", "llm")
        if (path := getattr(args, name, None)) is not None
    }
    if files and args.vae is not None:
        files["vae"] = str(args.vae)
    for name in ENGINE_FILES:  # stable-diffusion.cpp's other component files (core's families refuse them)
        if (path := getattr(args, name, None)) is not None:
            files[name] = str(path)
    return files


def lora_argument(text: str) -> tuple[Path, float]:
    """``file.safetensors:0.7`` -> (path, 0.7); without ``:STRENGTH`` the strength is 1."""
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            return Path(head), float(tail)
        except ValueError:
            pass  # a ':' of the path itself (C:\\...)
    return Path(text), 1.0


def check(args: argparse.Namespace) -> list[tuple[Path, float]]:
    """The LoRAs the flags and the prompt's tags ask for, checked before any model loads."""
    loras = [lora_argument(text) for text in args.lora]
    if LORA_TAG.search(args.prompt):
        if args.lora_dir is None:
            raise InputError("the prompt has <lora:...> tags: say where their files are with --lora-dir DIR")
        loras += prompt_loras(args.prompt, args.lora_dir)
    for path, _ in loras:
        if not path.is_file():
            raise InputError(f"--lora: no such file: {path}")
    return loras


def apply(pipe: Any, args: argparse.Namespace, loras: list[tuple[Path, float]]) -> None:
    """Load the embeddings, the VAE and the LoRAs onto a loaded pipeline."""
    for path in args.embedding:
        pipe.load_embedding(path)
    if args.vae is not None and "vae" not in component_files(args):
        pipe.set_vae(args.vae)
    if loras:
        pipe.set_loras(loras)
