"""GFPGAN face-restoration files (GFPGAN v1.2 / v1.3 / v1.4: the "clean" architecture, spandrel's
``GFPGAN`` = ``GFPGANv1Clean``): configuration read from a ``.safetensors`` file's keys and shapes.

Recognised as spandrel recognises it (``toRGB.0.weight`` and ``stylegan_decoder.style_mlp.1.weight``),
plus the clean architecture's own first conv (``conv_body_first.weight``; the original GFPGANv1
with compiled StyleGAN2 ops names it ``conv_body_first.0.weight`` and is not read). spandrel builds
every such file as v1.4's configuration (512 px, style width 512, channel multiplier 2); here that
configuration is read from the shapes instead, so a file of another one is named and refused (no
graph) rather than failing on a shape:

- the levels: ``conv_body_up.<i>`` blocks (``log2(size) - 2``), so the face size;
- the decoder's width ``stylegan_decoder.constant_input.weight``'s channels (512 * narrow) and its
  channel multiplier from the 64 px style conv (``256 * multiplier * narrow`` channels);
- the style width from the modulations' input; one style per layer (``different_w``: the final
  linear's outputs are ``(2 log2(size) - 2) * width``) or one for all;
- SFT on half the channels (``sft_half``: the condition convs' outputs equal the level's width).

The weights fill the shipped weightless graph ``graphs/gfpgan_v1clean_512px_ch512x2_w512``
(``fixtures/faces/gfpgan/export_gfpgan_graphs.py``). It computes the restored image only: the
file's ``toRGB.*`` convs (GFPGAN's intermediate outputs), the decoder's ``style_mlp`` (unused:
the encoder's styles are latent already) and its stored ``noises.noise<i>`` buffers are not
graph initializers; the noise maps are graph inputs. A training wrapper's prefix (``params_ema.``,
``params.``, ``module.``) is dropped. ``.pth`` files are refused unread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families import shipped_weights
from sdkit.families.safetensors_reader import SafetensorsFile, TensorEntry
from sdkit.families.shipped import graphs_dir
from sdkit.families.shipped_weights import (
    SELECT_PARAMS,
    check_fit,
    find_named_graph,
    initializer_shapes,
    pth_refusal_message,
    shipped_graph_names,
)
from sdkit.model import PICKLED_SUFFIXES, Graph, WeightSet

WRAPPER_PREFIXES = ("params_ema.", "params.", "module.")
DETECT_KEYS = ("toRGB.0.weight", "stylegan_decoder.style_mlp.1.weight")  # spandrel's
CLEAN_KEYS = ("conv_body_first.weight", "final_linear.weight", "stylegan_decoder.constant_input.weight")
UNUSED_PREFIXES = ("toRGB.", "stylegan_decoder.style_mlp.", "stylegan_decoder.noises.")
_UP = re.compile(r"^conv_body_up\.(\d+)\.conv1\.weight$")
_DOWN = re.compile(r"^conv_body_down\.(\d+)\.conv1\.weight$")
_MLP = re.compile(r"^stylegan_decoder\.style_mlp\.(\d+)\.weight$")
_NOISE = re.compile(r"^stylegan_decoder\.noises\.noise(\d+)$")


def pth_refusal(name: str) -> str:
    """Why a GFPGAN ``.pth`` is refused, and the one-line conversion (GFPGAN's releases keep
    their weights under ``params_ema``), as for the upscalers."""
    return pth_refusal_message(name, "face-restoration files", select=SELECT_PARAMS)


@dataclass(frozen=True)
class GFPGANConfig:
    """GFPGANv1Clean's configuration: face ``size`` (out_size), the decoder's ``width`` at 4 px
    (``512 * narrow``), ``channel_multiplier``, ``style_width`` (num_style_feat), ``num_mlp``,
    ``different_w`` and ``sft_half``."""

    size: int
    width: int
    channel_multiplier: int
    style_width: int
    num_mlp: int = 8
    different_w: bool = True
    sft_half: bool = True

    @property
    def layers(self) -> int:
        """The decoder's style convs, one noise map each: ``2 * (log2(size) - 2) + 1``."""
        return 2 * (self.size.bit_length() - 3) + 1

    @property
    def graph_name(self) -> str:
        tail = ("" if self.different_w else "_samew") + ("" if self.sft_half else "_sftfull")
        return f"gfpgan_v1clean_{self.size}px_ch{self.width}x{self.channel_multiplier}_w{self.style_width}{tail}"

    def noise_shapes(self) -> list[tuple[int, int, int, int]]:
        """The noise maps' shapes: 4 x 4, then two per level up to the face size."""
        sides = [4] + [2**i for i in range(3, self.size.bit_length()) for _ in range(2)]
        return [(1, 1, side, side) for side in sides]

    def describe(self) -> str:
        extra = ("" if self.different_w else ", one style") + ("" if self.sft_half else ", SFT on all channels")
        return (
            f"GFPGAN v1 clean {self.size} px (width {self.width}, channel multiplier {self.channel_multiplier}, "
            f"style width {self.style_width}{extra})"
        )


def strip_wrapper(keys: Iterable[str]) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    return shipped_weights.strip_wrapper(keys, WRAPPER_PREFIXES)


def _count(pattern: re.Pattern[str], keys: Iterable[str]) -> int:
    found = {int(m.group(1)) for k in keys if (m := pattern.match(k))}
    return len(found) if found == set(range(len(found))) else -1


def _config(shapes: Mapping[str, tuple[int, ...]]) -> GFPGANConfig | None:
    levels = _count(_UP, shapes)
    if levels < 1 or _count(_DOWN, shapes) != levels:
        return None
    log_size = levels + 2
    width = shapes["stylegan_decoder.constant_input.weight"][1]
    style_width = shapes["stylegan_decoder.to_rgb1.modulated_conv.modulation.weight"][1]
    multiplier = 2  # only seen from 64 px up; spandrel's default below that
    if log_size >= 6:
        ch64 = shapes["stylegan_decoder.style_convs.6.modulated_conv.weight"][1]
        multiplier, rest = divmod(2 * ch64, width)
        if rest or multiplier < 1:
            return None
    styles = shapes["final_linear.weight"][0]
    if styles not in ((2 * log_size - 2) * style_width, style_width):
        return None
    level_width = shapes["conv_body_up.0.conv2.weight"][0]
    sft_out = shapes["condition_scale.0.2.weight"][0]
    if sft_out not in (level_width, 2 * level_width):
        return None
    mlp = {int(m.group(1)) for k in shapes if (m := _MLP.match(k))}
    return GFPGANConfig(
        2**log_size,
        width,
        multiplier,
        style_width,
        num_mlp=len(mlp),
        different_w=styles != style_width,
        sft_half=sft_out == level_width,
    )


def sniff(shapes: Mapping[str, tuple[int, ...]]) -> GFPGANConfig | None:
    """The file's configuration if these keys/shapes are a GFPGAN v1 clean file (a wrapper
    prefix allowed), else None; never raises for a foreign file."""
    try:
        names = strip_wrapper(shapes)
        own = {names[k]: tuple(int(d) for d in v) for k, v in shapes.items()}
        if not all(k in own for k in (*DETECT_KEYS, *CLEAN_KEYS)):
            return None
        return _config(own)
    except (KeyError, ValueError, IndexError, TypeError, ZeroDivisionError):
        return None


def gfpgan_graph_names() -> list[str]:
    """The shipped GFPGAN graphs."""
    return shipped_graph_names(graphs_dir(), ("gfpgan_",))


def find_graph(config: GFPGANConfig, folders: Iterable[str | os.PathLike[str]] = ()) -> Graph:
    """The weightless graph of ``config``: from ``folders`` (first) or the shipped ones."""
    graph = find_named_graph(config.graph_name, [*folders, graphs_dir()])
    if graph is not None:
        return graph
    raise ModelFormatError(
        f"no graph for {config.describe()}; sdkit ships {', '.join(gfpgan_graph_names())} (GFPGAN v1.2-v1.4; "
        f"fixtures/faces/gfpgan/export_gfpgan_graphs.py exports others as {config.graph_name}.onnx.gz)"
    )


class GFPGANFile:
    """A GFPGAN ``.safetensors`` file: its configuration now, its weights (under the graph's
    names, float32) on ``weights()``, its stored noise maps on ``stored_noise()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() in (*PICKLED_SUFFIXES, ".pth"):
            raise ModelFormatError(pth_refusal(self.path.name))
        if not self.path.is_file():
            raise ModelFormatError(f"GFPGAN file not found: {self.path}")
        self.file = SafetensorsFile(self.path)
        self.names = strip_wrapper(self.file.entries)
        shapes = {k: e.shape for k, e in self.file.entries.items()}
        config = sniff(shapes)
        if config is None:
            self.file.close()
            found = ", ".join(sorted(self.names.values())[:4])
            raise ModelFormatError(
                f"{self.path.name}: not a GFPGAN v1 clean file (GFPGAN v1.2-v1.4: {', '.join(DETECT_KEYS)} and "
                f"{CLEAN_KEYS[0]} with consistent shapes expected); found {found}..."
            )
        self.config = config

    @property
    def name(self) -> str:
        return self.path.stem

    def entries(self) -> dict[str, TensorEntry]:
        """Key without wrapper prefix -> the file's tensor entry."""
        return {self.names[k]: e for k, e in self.file.entries.items()}

    def weights(self, graph: Graph) -> WeightSet:
        """The graph's initializers from the file as float32, checked: each present with its
        shape; every other tensor one the graph does not use (``toRGB.*``, the decoder's
        ``style_mlp`` and noise buffers)."""
        specs = initializer_shapes(graph)
        entries = self.entries()
        check_fit(self.path.name, self.config.describe(), specs, entries, UNUSED_PREFIXES)
        return WeightSet({name: self.file.read(entries[name], np.float32) for name in specs})

    def stored_noise(self) -> list[np.ndarray]:
        """The decoder's stored noise maps (``stylegan_decoder.noises.noise<i>``), float32."""
        entries = self.entries()
        found = {int(m.group(1)): e for k, e in entries.items() if (m := _NOISE.match(k))}
        shapes = self.config.noise_shapes()
        if sorted(found) != list(range(len(shapes))) or any(found[i].shape != s for i, s in enumerate(shapes)):
            raise ModelFormatError(
                f"{self.path.name}: no complete set of stored noise maps (stylegan_decoder.noises.noise0.."
                f"noise{len(shapes) - 1} of shapes {[s[2] for s in shapes]}); use noise='random'"
            )
        return [np.asarray(self.file.read(found[i], np.float32)) for i in range(len(shapes))]

    def close(self) -> None:
        self.file.close()
