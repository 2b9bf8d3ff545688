"""Argument helpers shared by the commands: inputs from .npy files or random shapes,
backend/device/options flags."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.backend import TensorInfo
from sdkit.errors import InputError
from sdkit.limits import check_bytes, shape_bytes


def add_backend_arguments(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    parser.add_argument("--backend", default=default, help="backend name, or auto (default: %(default)s)")
    parser.add_argument("--device", default=None, help="device, e.g. cpu, cuda:0, vulkan:1")
    add_option_arguments(parser)


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16", "q8_0", "fp8"),
        default=None,
        help="compute precision (q8_0: 8-bit weights, ggml; fp8: FP8 weights, tensorrt)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    parser.add_argument("--no-cache", action="store_true", help="do not use the compiled-artifact cache")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input", "-i", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a .npy file"
    )
    parser.add_argument(
        "--random",
        action="append",
        default=[],
        metavar="NAME=SHAPE",
        help="a random standard-normal input, e.g. latent=1x4x32x32 (seeded by --seed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --random inputs (default: %(default)s)")


def options_from(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if getattr(args, "precision", None):
        options["precision"] = args.precision
    if getattr(args, "threads", None) is not None:
        options["threads"] = args.threads
    if getattr(args, "no_cache", False):
        options["cache"] = False
    return options


def _split(item: str, flag: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name or not value:
        raise InputError(f"{flag} expects NAME=VALUE, got {item!r}")
    return name, value


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d)
    except ValueError:
        raise InputError(f"cannot parse shape {text!r}: expected e.g. 1x4x32x32") from None
    if not shape or any(d < 0 for d in shape):
        raise InputError(f"cannot parse shape {text!r}: expected e.g. 1x4x32x32")
    return shape


def load_npy(path: str) -> np.ndarray:
    """A .npy file, never unpickled."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"input file not found: {path}")
    try:
        array: np.ndarray = np.load(file, allow_pickle=False)
        return array
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable .npy array: {exc}") from None


def collect_inputs(args: argparse.Namespace, inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Feeds from ``--input`` files and ``--random`` shapes (dtype from the model)."""
    by_name = {i.name: i for i in inputs}
    feeds: dict[str, np.ndarray] = {}
    for item in args.input:
        name, path = _split(item, "--input")
        feeds[name] = load_npy(str(Path(path).expanduser()))
    rng = np.random.default_rng(args.seed)
    for item in args.random:
        name, shape_text = _split(item, "--random")
        shape = parse_shape(shape_text)
        dtype = by_name[name].dtype if name in by_name else np.dtype(np.float32)
        # numpy draws float64 (or int64) first, then casts: both exist at once
        check_bytes(shape_bytes(shape, 8) + shape_bytes(shape, dtype.itemsize), f"--random {name}={shape_text}")
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0, 10, shape).astype(dtype)
    if not feeds and inputs:
        wanted = ", ".join(i.describe() for i in inputs)
        raise InputError(f"give the model's inputs with --input NAME=FILE.npy or --random NAME=SHAPE ({wanted})")
    return feeds


def input_shapes(feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in feeds.items()}


def print_columns(header: Sequence[str], lines: Sequence[Sequence[str]]) -> None:
    """A plain table: every column padded to its widest cell but the last (free text)."""
    rows = [header, *lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1])
