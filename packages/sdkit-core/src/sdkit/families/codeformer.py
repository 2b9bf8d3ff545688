"""CodeFormer face-restoration files (sczhou's v0.1.0 architecture, as A1111 and spandrel run it):
recognised and configured from a ``.safetensors`` file's keys and shapes, as spandrel_extra_arches
does.

The network: a VQGAN encoder (six levels of two residual blocks, ``nf`` wide times ``ch_mult``),
a transformer (``n_layers`` layers, ``dim_embd`` wide, 8 heads, learned ``position_emb``) that
predicts a codebook index per latent token, the codebook lookup (top-1), AdaIN to the encoder's
latent, and the VQGAN decoder into which ``fuse_convs_dict`` blocks add the encoder's features
at the ``connect`` resolutions, scaled by the fidelity weight ``w``. Its weights fill a shipped
weightless graph (``graphs/codeformer_*``, exported from spandrel_extra_arches' module by
``fixtures/faces/codeformer/export_codeformer_graphs.py``) whose inputs are the crop ``image``
[1, 3, size, size] in [-1, 1] and ``w`` [1], and whose output ``restored`` is
``CodeFormer.forward(image, weight=w, adain=True)[0]``.

Recognised as spandrel does: the keys ``position_emb``, ``idx_pred_layer.1.weight``,
``quantize.embedding.weight``, ``ft_layers.0.self_attn.in_proj_weight`` and
``encoder.blocks.0.weight``; a converted ``.pth`` may keep the training wrapper's prefix
(``params_ema.``, ``params.``, ``module.``), which is dropped. Read from the shapes: the crop side
(``32 * sqrt(tokens)``), ``nf``, ``ch_mult``, ``dim_embd``, ``n_layers``, the codebook size and the
fused resolutions; 8 attention heads (spandrel's loader: "cannot be deduced from state dict").
A1111's ``codeformer-v0.1.0.pth`` is 512 px, nf 64, ch_mult (1, 2, 2, 4, 4, 8), 512 wide, 9
layers, 1024 codes, fused at 32, 64, 128 and 256.
"""

from __future__ import annotations

import math
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
DETECT_KEYS = (
    "position_emb",
    "idx_pred_layer.1.weight",
    "quantize.embedding.weight",
    "ft_layers.0.self_attn.in_proj_weight",
    "encoder.blocks.0.weight",
)
N_HEAD = 8
LEVELS = 6  # VQGAN levels; the residual block of level i is encoder.blocks.<1 + 3 i>
EMBED = 256  # the codebook's width (CodeFormer's feat_emb is Linear(256, dim_embd))
_LAYER = re.compile(r"^ft_layers\.(\d+)\.")
_FUSE = re.compile(r"^fuse_convs_dict\.(\d+)\.scale\.0\.weight$")


@dataclass(frozen=True)
class CodeFormerConfig:
    """A CodeFormer's configuration (module docstring); ``size`` is the face crop's side."""

    size: int
    nf: int
    ch_mult: tuple[int, ...]
    dim_embd: int
    n_layers: int
    codebook_size: int
    connect: tuple[int, ...]

    @property
    def graph_name(self) -> str:
        mults = "".join(str(m) for m in self.ch_mult)
        fused = "-".join(str(r) for r in self.connect)
        return (
            f"codeformer_s{self.size}_nf{self.nf}_m{mults}_d{self.dim_embd}_l{self.n_layers}"
            f"_c{self.codebook_size}_f{fused}"
        )

    def describe(self) -> str:
        return (
            f"CodeFormer {self.size} px (nf {self.nf}, ch_mult {list(self.ch_mult)}, {self.n_layers} layers of "
            f"{self.dim_embd}, {self.codebook_size} codes, fused at {list(self.connect)})"
        )


V010 = CodeFormerConfig(512, 64, (1, 2, 2, 4, 4, 8), 512, 9, 1024, (32, 64, 128, 256))


def strip_wrapper(keys: Iterable[str]) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    return shipped_weights.strip_wrapper(keys, WRAPPER_PREFIXES)


def _dims(shapes: Mapping[str, tuple[int, ...]], key: str, rank: int) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shapes[key])
    if len(shape) != rank:
        raise ModelFormatError(f"CodeFormer tensor {key} has shape {list(shape)}, {rank} dimensions expected")
    return shape


def _config(shapes: Mapping[str, tuple[int, ...]]) -> CodeFormerConfig:
    """The configuration from a CodeFormer's tensors under their module names."""
    nf, in_nc = _dims(shapes, "encoder.blocks.0.weight", 4)[:2]
    tokens, dim = _dims(shapes, "position_emb", 2)
    codebook = _dims(shapes, "idx_pred_layer.1.weight", 2)[0]
    latent = math.isqrt(tokens)
    if in_nc != 3:
        raise ModelFormatError(f"CodeFormer with {in_nc} input channels: only RGB models are read")
    if latent < 2 or latent * latent != tokens or dim % N_HEAD or nf < 1:
        raise ModelFormatError(
            f"CodeFormer with {tokens} position embeddings of {dim}: a square grid and 8 heads expected"
        )
    if _dims(shapes, "quantize.embedding.weight", 2) != (codebook, EMBED):
        raise ModelFormatError(f"CodeFormer codebook is not [{codebook}, {EMBED}]")
    size = 32 * latent
    mult = []
    for level in range(LEVELS):
        width = _dims(shapes, f"encoder.blocks.{1 + 3 * level}.conv1.weight", 4)[0]
        if width % nf:
            raise ModelFormatError(f"CodeFormer encoder level {level} is {width} wide, not a multiple of nf {nf}")
        mult.append(width // nf)
    layers = 1 + max(int(m.group(1)) for k in shapes if (m := _LAYER.match(k)))
    connect = sorted(int(m.group(1)) for k in shapes if (m := _FUSE.match(k)))
    if any(r not in {size >> i for i in range(LEVELS)} for r in connect):
        raise ModelFormatError(f"CodeFormer {size} px fuses features at {connect}: not resolutions of its levels")
    return CodeFormerConfig(size, nf, tuple(mult), dim, layers, codebook, tuple(connect))


def sniff(shapes: Mapping[str, tuple[int, ...]]) -> CodeFormerConfig | None:
    """The file's configuration if these keys/shapes are a CodeFormer (wrapper prefixes allowed),
    else None. Never raises for a foreign file; a file with CodeFormer's keys but shapes that do
    not make one is a ModelFormatError."""
    names = strip_wrapper(shapes)
    stripped = {names[k]: v for k, v in shapes.items()}
    if not all(k in stripped for k in DETECT_KEYS):
        return None
    try:
        return _config(stripped)
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelFormatError(f"a CodeFormer file with missing or odd tensors ({exc})") from None


def pth_refusal(name: str) -> str:
    """Why a CodeFormer ``.pth`` is refused, and the one-line conversion (A1111's
    ``codeformer-v0.1.0.pth`` keeps its weights under ``params_ema``)."""
    return pth_refusal_message(name, "CodeFormer files", select=SELECT_PARAMS)


def codeformer_graph_names() -> list[str]:
    """The shipped CodeFormer graphs."""
    return shipped_graph_names(graphs_dir(), ("codeformer_",))


def find_graph(config: CodeFormerConfig, folders: Iterable[str | os.PathLike[str]] = ()) -> Graph:
    """The weightless graph of ``config``: from ``folders`` (first) or the shipped ones."""
    graph = find_named_graph(config.graph_name, [*folders, graphs_dir()])
    if graph is not None:
        return graph
    raise ModelFormatError(
        f"no graph for {config.describe()}; sdkit ships {', '.join(codeformer_graph_names())} "
        f"(fixtures/faces/codeformer/export_codeformer_graphs.py exports others as {config.graph_name}.onnx.gz)"
    )


class CodeFormerFile:
    """A CodeFormer ``.safetensors`` file: its configuration now, its weights (under the graph's
    names, float32) on ``weights()``. ``.pth`` and other pickles are refused unread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() in PICKLED_SUFFIXES:
            raise ModelFormatError(pth_refusal(self.path.name))
        if not self.path.is_file():
            raise ModelFormatError(f"CodeFormer file not found: {self.path}")
        self.file = SafetensorsFile(self.path)
        try:
            self.names = strip_wrapper(self.file.entries)
            config = sniff({k: e.shape for k, e in self.file.entries.items()})
        except ModelFormatError as exc:
            self.file.close()
            raise ModelFormatError(f"{self.path.name}: {exc}") from None
        if config is None:
            self.file.close()
            raise ModelFormatError(
                f"{self.path.name} is not a CodeFormer file: keys {', '.join(DETECT_KEYS)} expected "
                f"(found {', '.join(sorted(self.names.values())[:4])}...)"
            )
        self.config = config

    def weights(self, graph: Graph) -> WeightSet:
        """The file's tensors as float32 under ``graph``'s initializer names, checked complete:
        every initializer present with its shape, no tensor left over."""
        specs = initializer_shapes(graph)
        entries = {self.names[k]: e for k, e in self.file.entries.items()}
        check_fit(self.path.name, self.config.describe(), specs, entries)
        return WeightSet({name: self.file.read(entry, np.float32) for name, entry in entries.items()})

    def close(self) -> None:
        self.file.close()
