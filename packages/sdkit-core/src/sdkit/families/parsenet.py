"""ParseNet face-parsing files (facexlib's ``parsing_parsenet.pth``, converted to ``.safetensors``):
the configuration read from the file's keys and shapes, the weights filling a shipped weightless
graph.

facexlib's ``ParseNet`` (``facexlib/parsing/parsenet.py``, from PSFRGAN; what
``FaceRestoreHelper(use_parse=True)`` runs on each restored face for A1111's paste-back mask) is
``encoder.0`` (a 3x3 conv from RGB to ``base`` channels), ``down`` residual blocks halving the size
(``encoder.1..``), ``depth`` residual blocks (``body.*``), ``up`` blocks doubling it (nearest,
``decoder.*``), then ``out_img_conv`` (RGB) and ``out_mask_conv`` (``classes`` logits). Block
channels double down and halve up, clipped to [32, ``max_ch``]. Each block: a 3x3 conv + BatchNorm +
LeakyReLU(0.2), a 3x3 conv + BatchNorm, plus the input (through a biased 3x3 conv when the size or
width changes); every conv reflect-pads by 1. The released file is ``base`` 64, ``max_ch`` 256,
4 down, 10 body, 4 up, 19 classes (``ParseNet(in_size=512, out_size=512, parsing_ch=19)``): the
shipped graph ``graphs/parsenet_b64_x256_d4_u4_r10_c19`` (exported from facexlib's module by
``fixtures/faces/detect/export_parsenet_graphs.py``). The whole key set and every shape must be
the one this configuration builds; BatchNorm's ``num_batches_tracked`` is dropped from the file.
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
from sdkit.families.safetensors_reader import SafetensorsFile
from sdkit.families.shipped import graphs_dir
from sdkit.families.shipped_weights import find_named_graph, initializer_shapes, pth_refusal_message
from sdkit.model import PICKLED_SUFFIXES, Graph, WeightSet

MIN_CH = 32  # facexlib's ch_range lower end
WRAPPER_PREFIXES = ("module.", "params_ema.", "params.")
UNUSED_SUFFIX = ".num_batches_tracked"
_BLOCK = re.compile(r"^(encoder|body|decoder)\.(\d+)\.")


@dataclass(frozen=True)
class ParseNetConfig:
    """The widths and depths of a ParseNet file (module docstring)."""

    base: int = 64
    max_ch: int = 256
    down: int = 4
    up: int = 4
    depth: int = 10
    classes: int = 19

    @property
    def graph_name(self) -> str:
        c = self
        return f"parsenet_b{c.base}_x{c.max_ch}_d{c.down}_u{c.up}_r{c.depth}_c{c.classes}"

    @property
    def multiple_of(self) -> int:
        """The face's height and width must be multiples of this (and at least twice it)."""
        return int(2**self.down)

    def describe(self) -> str:
        return (
            f"ParseNet ({self.classes} classes, base {self.base}, {self.down} down / {self.depth} body / {self.up} up)"
        )


def strip_wrapper(keys: Iterable[str]) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    return shipped_weights.strip_wrapper(keys, WRAPPER_PREFIXES)


def expected_shapes(config: ParseNetConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor (but ``num_batches_tracked``) facexlib's ParseNet of ``config`` holds."""
    out: dict[str, tuple[int, ...]] = {}

    def clip(x: int) -> int:
        return max(MIN_CH, min(x, config.max_ch))

    def conv(prefix: str, cin: int, cout: int, bias: bool = True) -> None:
        out[f"{prefix}.conv2d.weight"] = (cout, cin, 3, 3)
        if bias:
            out[f"{prefix}.conv2d.bias"] = (cout,)

    def block(prefix: str, cin: int, cout: int, scaled: bool) -> None:
        if scaled or cin != cout:
            conv(f"{prefix}.shortcut_func", cin, cout)
        for name, c_in in (("conv1", cin), ("conv2", cout)):
            conv(f"{prefix}.{name}", c_in, cout, bias=False)
            for part in ("weight", "bias", "running_mean", "running_var"):
                out[f"{prefix}.{name}.norm.norm.{part}"] = (cout,)

    conv("encoder.0", 3, config.base)
    head = config.base
    for i in range(config.down):
        block(f"encoder.{i + 1}", clip(head), clip(head * 2), True)
        head *= 2
    for i in range(config.depth):
        block(f"body.{i}", clip(head), clip(head), False)
    for i in range(config.up):
        block(f"decoder.{i}", clip(head), clip(head // 2), True)
        head //= 2
    conv("out_img_conv", clip(head), 3)
    conv("out_mask_conv", clip(head), config.classes)
    return out


def sniff(shapes: Mapping[str, tuple[int, ...]]) -> ParseNetConfig | None:
    """The file's config if these keys/shapes are a ParseNet's (wrapper prefixes allowed), else
    None (never raises for a foreign file)."""
    try:
        named = {
            key: tuple(shapes[file_key])
            for file_key, key in strip_wrapper(shapes).items()
            if not key.endswith(UNUSED_SUFFIX)
        }
        first, mask = named.get("encoder.0.conv2d.weight"), named.get("out_mask_conv.conv2d.weight")
        body = named.get("body.0.conv1.conv2d.weight")
        if first is None or mask is None or body is None:
            return None
        counts = {"encoder": 0, "body": 0, "decoder": 0}
        for key in named:
            if m := _BLOCK.match(key):
                counts[m.group(1)] = max(counts[m.group(1)], int(m.group(2)) + (m.group(1) != "encoder"))
        config = ParseNetConfig(
            base=int(first[0]),
            max_ch=int(body[0]),
            down=counts["encoder"],
            up=counts["decoder"],
            depth=counts["body"],
            classes=int(mask[0]),
        )
        return config if expected_shapes(config) == named else None
    except (TypeError, ValueError, AttributeError, IndexError):
        return None


def pth_refusal(name: str) -> str:
    return pth_refusal_message(name, "face-parsing files")


def find_graph(config: ParseNetConfig, folders: Iterable[str | os.PathLike[str]] = ()) -> Graph:
    """The weightless graph of ``config``: from ``folders`` (first) or the shipped ones."""
    graph = find_named_graph(config.graph_name, [*folders, graphs_dir()])
    if graph is not None:
        return graph
    raise ModelFormatError(
        f"no graph for {config.describe()}: sdkit ships {ParseNetConfig().graph_name} "
        f"(facexlib's parsing_parsenet); fixtures/faces/detect/export_parsenet_graphs.py exports others"
    )


class ParseNetFile:
    """A ParseNet ``.safetensors`` file: its config now, its weights on ``weights()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() in PICKLED_SUFFIXES:
            raise ModelFormatError(pth_refusal(self.path.name))
        if not self.path.is_file():
            raise ModelFormatError(f"face-parsing file not found: {self.path}")
        self.file = SafetensorsFile(self.path)
        config = sniff({k: e.shape for k, e in self.file.entries.items()})
        if config is None:
            self.file.close()
            raise ModelFormatError(
                f"{self.path.name}: not a ParseNet file (facexlib's parsing_parsenet: encoder.*, body.*, "
                f"decoder.*, out_img_conv.*, out_mask_conv.* keys with ParseNet's shapes expected)"
            )
        self.config = config
        self.names = strip_wrapper(self.file.entries)

    def weights(self, graph: Graph) -> WeightSet:
        """The file's tensors as float32 under the graph's initializer names (sniff has checked
        the key set and shapes against the configuration; the graph's are checked here)."""
        specs = initializer_shapes(graph)
        entries = {self.names[k]: e for k, e in self.file.entries.items() if not self.names[k].endswith(UNUSED_SUFFIX)}
        if {k: e.shape for k, e in entries.items()} != specs:
            raise ModelFormatError(f"{self.path.name} does not fit the {self.config.describe()} graph")
        return WeightSet({name: self.file.read(entry, np.float32) for name, entry in entries.items()})

    def close(self) -> None:
        self.file.close()
