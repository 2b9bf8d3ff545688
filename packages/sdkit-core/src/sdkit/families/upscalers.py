"""Upscaler files (ESRGAN / Real-ESRGAN RRDBNet, Real-ESRGAN Compact, SwinIR): architecture, key
layout and configuration read from a ``.safetensors`` file's keys and shapes, as spandrel does.

Three architectures, each on a shipped weightless graph (``graphs/esrgan_*``, ``graphs/compact_*``,
``graphs/swinir_*``, exported from spandrel's modules by ``fixtures/upscalers/export_upscaler_graphs.py``
and ``export_swinir_graphs.py``):

- **ESRGAN** (RRDBNet). Graph initializers use the old-arch names spandrel's ``RRDBNet`` holds
  (``model.0.weight``, ``model.1.sub.<i>.RDB<j>.conv<k>.0.weight``, ``model.1.sub.<nb>.weight``,
  ``model.<3u>.weight`` for the u-th upsampling conv, then the HR conv and the last conv). Three
  layouts are read: that one (ESRGAN_4x and most community files), Real-ESRGAN's
  (``conv_first``, ``body.<i>.rdb<j>.conv<k>``, ``conv_body``, ``conv_up<u>``, ``conv_hr``,
  ``conv_last``) and BSRGAN's (``RRDB_trunk.<i>.RDB<j>.conv<k>``, ``trunk_conv``, ``upconv<u>``,
  ``HRconv``). ``nf`` is ``model.0.weight``'s output channels, ``nb`` the number of RRDB blocks,
  the network's scale ``2 ** upsampling convs``; input channels 12 (or 48) for 3 output
  channels mean Real-ESRGAN's pixel-unshuffle by 2 (or 4): x2plus is the 4x network on the
  unshuffled image.
- **Compact** (SRVGGNetCompact): ``body.<i>.weight`` convs and PReLU slopes; ``num_feat`` from the
  first conv, ``num_conv = (last index - 2) // 2``, the scale from the last conv's channels
  (``3 * scale**2``).
- **SwinIR**: spandrel's keys (``conv_first``, ``layers.<i>.residual_group.blocks.<j>.attn...``).
  As spandrel reads them: ``embed_dim`` from ``conv_first.weight``, the MLP ratio from ``fc1``,
  the window from ``relative_position_index`` (ws² x ws²), the depths and each layer's heads from
  the blocks and their ``relative_position_bias_table``, the residual conv (``conv_after_body``:
  1conv, else 3conv), the upsampler (``conv_before_upsample`` + ``conv_up1``: nearest+conv, else
  pixelshuffle; ``upsample.0`` alone: pixelshuffledirect; neither: none, 1x) and the scale from
  it; the pixel range is 255 for window 7 (the JPEG models), else 1. The graph takes any height
  and width that are multiples of the window (sdkit pads by reflection, as spandrel's forward
  does). The files' buffers (``relative_position_index``, ``attn_mask``) are not weights: the
  index is checked against the architecture's, the masks (made for the training size, from which
  the ``img_size`` is read) are computed in the graph for the size it runs at.

A checkpoint converted from a ``.pth`` may keep the training wrapper's prefix (``params_ema.``,
``params.``, ``module.``): it is dropped. Only RGB models (3 channels in and out) are read.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
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

ARCHITECTURES = ("esrgan", "compact", "swinir")
WRAPPER_PREFIXES = ("params_ema.", "params.", "module.")
_RRDB_NEW = re.compile(r"^(?:body\.(\d+)\.rdb(\d)|RRDB_trunk\.(\d+)\.RDB(\d))\.conv(\d)\.(weight|bias)$")
_UPCONV = re.compile(r"^(?:conv_up|upconv)(\d)\.(weight|bias)$")
_OLD_BLOCK = re.compile(r"^model\.1\.sub\.(\d+)\.RDB1\.conv1\.0\.weight$")
_MODEL_INDEX = re.compile(r"^model\.(\d+)\.")
_BODY_INDEX = re.compile(r"^body\.(\d+)\.(weight|bias)$")
_SWIN_BLOCK = re.compile(r"^layers\.(\d+)\.residual_group\.blocks\.(\d+)\.")
_SWIN_KEYS = (
    "layers.0.residual_group.blocks.0.norm1.weight",
    "layers.0.residual_group.blocks.0.mlp.fc1.bias",
    "layers.0.residual_group.blocks.0.attn.relative_position_index",
)
SWINIR_BUFFERS = (".attn.relative_position_index", ".attn_mask")


def pth_refusal(name: str) -> str:
    """Why an upscaler ``.pth`` is refused, and the one-line conversion (Real-ESRGAN's files keep
    their weights under ``params_ema`` or ``params``)."""
    return pth_refusal_message(name, "upscaler files", select=SELECT_PARAMS)


@dataclass(frozen=True)
class UpscalerConfig:
    """What a file holds: ``arch`` (esrgan | compact), feature width ``nf``, ``depth`` (RRDB
    blocks or Compact convs), the network's ``net_scale`` and Real-ESRGAN's pixel-unshuffle
    factor (0: none); ``scale`` is the image's (``net_scale / shuffle``)."""

    arch: str
    nf: int
    depth: int
    net_scale: int
    shuffle: int = 0

    @property
    def scale(self) -> int:
        return self.net_scale // self.shuffle if self.shuffle else self.net_scale

    @property
    def graph_name(self) -> str:
        if self.arch == "esrgan":
            tail = f"_unshuffle{self.shuffle}" if self.shuffle else ""
            return f"esrgan_nf{self.nf}_nb{self.depth}_x{self.net_scale}{tail}"
        return f"compact_nf{self.nf}_nc{self.depth}_x{self.net_scale}"

    @property
    def multiple_of(self) -> int:
        """The graph's height and width must be multiples of this (the unshuffle factor)."""
        return self.shuffle or 1

    @property
    def min_size(self) -> int:
        """Smaller images are padded to this size first (spandrel's descriptor: none here)."""
        return 0

    def describe(self) -> str:
        if self.arch == "esrgan":
            extra = f", pixel-unshuffle {self.shuffle}" if self.shuffle else ""
            return f"ESRGAN {self.scale}x (RRDBNet nf={self.nf}, nb={self.depth}{extra})"
        return f"Real-ESRGAN Compact {self.scale}x (num_feat={self.nf}, num_conv={self.depth})"


def _run(values: tuple[int, ...]) -> str:
    return f"{values[0]}x{len(values)}" if len(set(values)) == 1 else "-".join(map(str, values))


SWINIR_UPSAMPLERS = {"pixelshuffle": "ps", "nearest+conv": "nc", "pixelshuffledirect": "psd", "": "none"}


@dataclass(frozen=True)
class SwinIRConfig:
    """A SwinIR file's configuration, as spandrel reads it (module docstring); ``img_size`` is
    the training size its ``attn_mask`` buffers were made for."""

    embed_dim: int
    depths: tuple[int, ...]
    num_heads: tuple[int, ...]
    window_size: int
    mlp_ratio: float
    upsampler: str
    net_scale: int
    resi_connection: str
    img_size: int = 64
    arch: str = "swinir"

    @property
    def scale(self) -> int:
        return self.net_scale

    @property
    def img_range(self) -> float:
        return 255.0 if self.window_size == 7 else 1.0

    @property
    def graph_name(self) -> str:
        mlp = f"{self.mlp_ratio:g}".replace(".", "p")
        return (
            f"swinir_{SWINIR_UPSAMPLERS[self.upsampler]}_e{self.embed_dim}_d{_run(self.depths)}"
            f"_h{_run(self.num_heads)}_w{self.window_size}_m{mlp}_{self.resi_connection}_x{self.net_scale}"
        )

    @property
    def multiple_of(self) -> int:
        """The graph's height and width must be multiples of the window."""
        return self.window_size

    @property
    def min_size(self) -> int:
        """spandrel's SwinIR descriptor pads images under 16 pixels to 16 first."""
        return 16

    def describe(self) -> str:
        up = self.upsampler or "no upsampler"
        return (
            f"SwinIR {self.scale}x (embed_dim={self.embed_dim}, depths={_run(self.depths)}, "
            f"heads={_run(self.num_heads)}, window={self.window_size}, mlp_ratio={self.mlp_ratio:g}, {up}, "
            f"{self.resi_connection})"
        )


AnyUpscalerConfig = UpscalerConfig | SwinIRConfig


def _strip_wrapper(keys: Iterable[str]) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    return shipped_weights.strip_wrapper(keys, WRAPPER_PREFIXES)


def _new_esrgan_name(key: str, blocks: int, last_up: int) -> str | None:
    """An old-arch name for a Real-ESRGAN or BSRGAN key (None: not an RRDBNet key)."""
    if m := _RRDB_NEW.match(key):
        block = m.group(1) or m.group(3)
        rdb = m.group(2) or m.group(4)
        return f"model.1.sub.{block}.RDB{rdb}.conv{m.group(5)}.0.{m.group(6)}"
    if m := _UPCONV.match(key):
        return f"model.{int(m.group(1)) * 3}.{m.group(2)}"
    stem, _, kind = key.rpartition(".")
    renames = {
        "conv_first": "model.0",
        "conv_body": f"model.1.sub.{blocks}",
        "trunk_conv": f"model.1.sub.{blocks}",
        "conv_hr": f"model.{last_up + 2}",
        "HRconv": f"model.{last_up + 2}",
        "conv_last": f"model.{last_up + 4}",
    }
    return f"{renames[stem]}.{kind}" if stem in renames and kind in ("weight", "bias") else None


def _esrgan_layout(keys: Iterable[str]) -> str | None:
    keys = set(keys)
    if "model.0.weight" in keys and "model.1.sub.0.RDB1.conv1.0.weight" in keys:
        return "esrgan"
    if "model.0.weight" in keys and "model.1.sub.0.RDB1.conv1x1.weight" in keys:
        raise ModelFormatError("ESRGAN+ files (RDB conv1x1 layers) are not supported yet")
    if {"conv_first.weight", "body.0.rdb1.conv1.weight", "conv_body.weight", "conv_last.weight"} <= keys:
        return "real-esrgan"
    if {"conv_first.weight", "RRDB_trunk.0.RDB1.conv1.weight", "trunk_conv.weight", "conv_last.weight"} <= keys:
        return "bsrgan"
    return None


def canonical_names(keys: Iterable[str]) -> tuple[str, str, dict[str, str]]:
    """``(architecture, layout, {file key: graph initializer name})`` of an upscaler file's keys,
    or a ModelFormatError naming what is known."""
    stripped = _strip_wrapper(keys)
    names = set(stripped.values())
    layout = _esrgan_layout(names)
    if layout == "esrgan":
        return "esrgan", layout, stripped
    if layout is not None:
        blocks = 1 + max(int(m.group(1) or m.group(3)) for k in names if (m := _RRDB_NEW.match(k)))
        ups = [int(m.group(1)) * 3 for k in names if (m := _UPCONV.match(k))]
        last_up = max(ups, default=0)
        mapping: dict[str, str] = {}
        for file_key, key in stripped.items():
            name = _new_esrgan_name(key, blocks, last_up)
            if name is None:
                raise ModelFormatError(f"{layout} upscaler file: unexpected tensor {file_key!r}")
            mapping[file_key] = name
        return "esrgan", layout, mapping
    if {"body.0.weight", "body.1.weight"} <= names and all(_BODY_INDEX.match(k) for k in names):
        return "compact", "compact", stripped
    if set(_SWIN_KEYS) <= names and names & {"conv_first.weight", "conv_first.1.weight"}:
        if "conv_first.1.weight" in names:
            raise ModelFormatError("SwinIR with a pixel-unshuffled input (conv_first.1) is not supported yet")
        return "swinir", "swinir", stripped
    raise ModelFormatError(
        "not an upscaler file sdkit reads: ESRGAN (model.0.weight + model.1.sub.0.RDB1...), "
        "Real-ESRGAN (conv_first + body.0.rdb1...), BSRGAN (RRDB_trunk...), Real-ESRGAN "
        "Compact (body.0.weight, body.1.weight) or SwinIR (conv_first + layers.0.residual_group...) "
        f"keys expected; found {', '.join(sorted(names)[:4])}..."
    )


def _esrgan_config(shapes: Mapping[str, tuple[int, ...]]) -> UpscalerConfig:
    first = shapes["model.0.weight"]
    indices = [int(m.group(1)) for k in shapes if (m := _MODEL_INDEX.match(k))]
    seq_len = max(indices) + 1
    net_scale = 2 ** ((seq_len - 5) // 3)
    blocks = [int(m.group(1)) for k in shapes if (m := _OLD_BLOCK.match(k))]
    in_nc, out_nc = first[1], shapes[f"model.{seq_len - 1}.weight"][0]
    shuffle = 0
    if out_nc == 3 and in_nc in (12, 48):
        shuffle = math.isqrt(in_nc // out_nc)
    elif in_nc != 3 or out_nc != 3:
        raise ModelFormatError(f"ESRGAN with {in_nc} input / {out_nc} output channels: only RGB models are read")
    if (seq_len - 5) % 3 or not blocks:
        raise ModelFormatError(f"ESRGAN file with an unexpected layer sequence ({seq_len} top-level layers)")
    return UpscalerConfig("esrgan", first[0], max(blocks) + 1, net_scale, shuffle)


def _compact_config(shapes: Mapping[str, tuple[int, ...]]) -> UpscalerConfig:
    highest = max(int(m.group(1)) for k in shapes if (m := _BODY_INDEX.match(k)))
    first = shapes["body.0.weight"]
    last = shapes[f"body.{highest}.bias"][0]
    scale = math.isqrt(last // 3) if last % 3 == 0 else 0
    if first[1] != 3 or scale * scale * 3 != last:
        raise ModelFormatError(
            f"Real-ESRGAN Compact with {first[1]} input channels and a last conv of {last}: only RGB models are read"
        )
    return UpscalerConfig("compact", first[0], (highest - 2) // 2, scale)


def _swinir_upsampler(shapes: Mapping[str, tuple[int, ...]], out_ch: int) -> tuple[str, int]:
    """(upsampler kind, scale) as spandrel reads them."""
    if "conv_before_upsample.0.weight" in shapes:
        if "conv_up1.weight" in shapes:
            ups = [k for k in shapes if k.startswith("conv_up") and k.endswith(".weight")]
            return "nearest+conv", 2 ** len(ups)
        scale = 1
        for i in range(0, 10, 2):
            if (shape := shapes.get(f"upsample.{i}.weight")) is None:
                break
            scale *= math.isqrt(shape[0] // shape[1])
        return "pixelshuffle", scale
    if "upsample.0.weight" in shapes:
        return "pixelshuffledirect", math.isqrt(shapes["upsample.0.bias"][0] // out_ch)
    return "", 1


def _swinir_config(shapes: Mapping[str, tuple[int, ...]]) -> SwinIRConfig:
    first = shapes["conv_first.weight"]
    out_ch = shapes["conv_last.weight"][0] if "conv_last.weight" in shapes else first[1]
    if first[1] != 3 or out_ch != 3:
        raise ModelFormatError(f"SwinIR with {first[1]} input / {out_ch} output channels: only RGB models are read")
    upsampler, scale = _swinir_upsampler(shapes, out_ch)
    embed = first[0]
    block0 = "layers.0.residual_group.blocks.0."
    index = shapes[block0 + "attn.relative_position_index"]
    window = math.isqrt(index[0])
    blocks: dict[int, int] = {}
    for key in shapes:
        if m := _SWIN_BLOCK.match(key):
            layer, block = int(m.group(1)), int(m.group(2))
            blocks[layer] = max(blocks.get(layer, 0), block + 1)
    layers = max(blocks) + 1
    depths = tuple(blocks.get(i, 0) for i in range(layers))
    table = "layers.{}.residual_group.blocks.0.attn.relative_position_bias_table"
    heads = tuple(shapes[table.format(i)][1] for i in range(layers))
    mask = shapes.get("layers.0.residual_group.blocks.1.attn_mask")
    img_size = math.isqrt(mask[0]) * window if mask is not None else 64
    if window * window != index[0] or img_size <= window or 0 in depths:
        raise ModelFormatError(
            f"SwinIR with window {window}, training size {img_size} and depths {list(depths)}: "
            "windows smaller than the training size (spandrel's shifted windows) expected"
        )
    return SwinIRConfig(
        embed_dim=embed,
        depths=depths,
        num_heads=heads,
        window_size=window,
        mlp_ratio=shapes[block0 + "mlp.fc1.bias"][0] / embed,
        upsampler=upsampler,
        net_scale=scale,
        resi_connection="1conv" if "conv_after_body.weight" in shapes else "3conv",
        img_size=img_size,
    )


def detect_config(shapes: Mapping[str, tuple[int, ...]]) -> AnyUpscalerConfig:
    """The configuration of an upscaler from its tensors under graph names."""
    arch = "esrgan" if "model.0.weight" in shapes else "swinir" if "conv_first.weight" in shapes else "compact"
    readers: dict[str, Callable[[Mapping[str, tuple[int, ...]]], AnyUpscalerConfig]] = {
        "esrgan": _esrgan_config,
        "compact": _compact_config,
        "swinir": _swinir_config,
    }
    try:
        return readers[arch](shapes)
    except (KeyError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise ModelFormatError(f"an {arch} upscaler file with missing or odd tensors ({exc})") from None


def upscaler_graph_names() -> list[str]:
    """The shipped upscaler graphs (``esrgan_...``, ``compact_...``, ``swinir_...``)."""
    return shipped_graph_names(graphs_dir(), ("esrgan_", "compact_", "swinir_"))


def find_graph(config: AnyUpscalerConfig, folders: Iterable[str | os.PathLike[str]] = ()) -> Graph:
    """The weightless graph of ``config``: from ``folders`` (first) or the shipped ones."""
    graph = find_named_graph(config.graph_name, [*folders, graphs_dir()])
    if graph is not None:
        return graph
    raise ModelFormatError(
        f"no graph for {config.describe()}; sdkit ships {', '.join(upscaler_graph_names())} "
        f"(fixtures/upscalers/export_{'swinir' if config.arch == 'swinir' else 'upscaler'}_graphs.py exports "
        f"others as {config.graph_name}.onnx.gz)"
    )


class UpscalerFile:
    """An upscaler ``.safetensors`` file: its architecture, layout and configuration now, its
    weights (under the graph's names, float32) on ``weights()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() in (*PICKLED_SUFFIXES, ".pth"):
            raise ModelFormatError(pth_refusal(self.path.name))
        if not self.path.is_file():
            raise ModelFormatError(f"upscaler file not found: {self.path}")
        self.file = SafetensorsFile(self.path)
        try:
            self.arch, self.layout, self.names = canonical_names(self.file.entries)
        except ModelFormatError as exc:
            raise ModelFormatError(f"{self.path.name}: {exc}") from None
        self.shapes = {self.names[k]: e.shape for k, e in self.file.entries.items()}
        self.config = detect_config(self.shapes)

    @property
    def name(self) -> str:
        return self.path.stem

    def entries(self) -> dict[str, TensorEntry]:
        """Graph name -> the file's tensor entry."""
        return {self.names[k]: e for k, e in self.file.entries.items()}

    def weights(self, graph: Graph) -> WeightSet:
        """The file's tensors as float32 under ``graph``'s initializer names, checked complete:
        every initializer present with its shape, no tensor left over."""
        specs = initializer_shapes(graph)
        entries = self.entries()
        if isinstance(self.config, SwinIRConfig):
            buffers = {k: e for k, e in entries.items() if k.endswith(SWINIR_BUFFERS)}
            entries = {k: e for k, e in entries.items() if k not in buffers}
            self._check_index(buffers, self.config.window_size)
        check_fit(self.path.name, self.config.describe(), specs, entries)
        return WeightSet({name: self.file.read(entry, np.float32) for name, entry in entries.items()})

    def _check_index(self, buffers: Mapping[str, TensorEntry], window: int) -> None:
        """The graph gathers each block's bias table by the architecture's index; spandrel by the
        file's: a file whose index differs is refused rather than run differently."""
        want = relative_position_index(window)
        for name, entry in buffers.items():
            if name.endswith(".relative_position_index"):
                got = self.file.read(entry, np.int64)
                if got.shape != want.shape or not np.array_equal(got, want):
                    raise ModelFormatError(
                        f"{self.path.name}: {name} is not SwinIR's relative position index for window {window}"
                    )

    def close(self) -> None:
        self.file.close()


def relative_position_index(window: int) -> np.ndarray:
    """SwinIR's ``WindowAttention.relative_position_index`` (int64 [window², window²]): for tokens
    i, j of a window, ``(dy + window - 1) * (2 * window - 1) + dx + window - 1``."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (window - 1)
    return np.asarray(rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1], dtype=np.int64)


# A1111's names for its Real-ESRGAN, ESRGAN and SwinIR models -> the file stem it downloads them
# as (``modules/realesrgan_model.py``, ``modules/esrgan_model.py``, ``extensions-builtin/SwinIR/
# scripts/swinir_model.py``: ``SwinIR_4x.pth``); other files are named by stem.
A1111_NAMES = {
    "R-ESRGAN 4x+": "RealESRGAN_x4plus",
    "R-ESRGAN 4x+ Anime6B": "RealESRGAN_x4plus_anime_6B",
    "R-ESRGAN 2x+": "RealESRGAN_x2plus",
    "R-ESRGAN General 4xV3": "realesr-general-x4v3",
    "R-ESRGAN General WDN 4xV3": "realesr-general-wdn-x4v3",
    "R-ESRGAN AnimeVideo": "realesr-animevideov3",
    "ESRGAN_4x": "ESRGAN_4x",
    "SwinIR 4x": "SwinIR_4x",  # 003_realSR_BSRGAN_DFOWMFC_s64w8_SwinIR-L_x4_GAN.pth, saved as SwinIR_4x.pth
}
UPSCALER_DIR_ENV = "SDKIT_UPSCALER_DIR"


def upscaler_folders(folders: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """``folders``, then those of ``$SDKIT_UPSCALER_DIR`` (``os.pathsep``-separated)."""
    env = [p for p in os.environ.get(UPSCALER_DIR_ENV, "").split(os.pathsep) if p]
    return [Path(f) for f in [*folders, *env]]


def available_upscalers(folders: Iterable[str | os.PathLike[str]] = ()) -> dict[str, Path]:
    """Name -> file of each ``.safetensors`` upscaler in the folders: A1111's name where the
    stem is one A1111 downloads, else the stem. Files are not opened here."""
    by_stem = {stem.lower(): name for name, stem in A1111_NAMES.items()}
    found: dict[str, Path] = {}
    for folder in upscaler_folders(folders):
        if folder.is_dir():
            for path in sorted(folder.glob("*.safetensors")):
                found.setdefault(by_stem.get(path.stem.lower(), path.stem), path)
    return found


def find_upscaler(name: str, folders: Iterable[str | os.PathLike[str]] = ()) -> Path | None:
    """The file of an upscaler given by A1111's name, a file stem in the folders, or a path."""
    text = str(name)
    if text.lower().endswith((".safetensors", *PICKLED_SUFFIXES)) or os.sep in text:
        return Path(text)
    known = available_upscalers(folders)
    for key, path in known.items():
        if key.lower() == text.lower() or path.stem.lower() == text.lower():
            return path
    return None
