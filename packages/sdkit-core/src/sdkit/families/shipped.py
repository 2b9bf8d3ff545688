"""The weightless architecture graphs shipped in ``sdkit/families/graphs/``.

Each ``<name>.onnx.gz`` holds a real SD-family architecture (see that folder's README.md) whose
initializers are the module's parameters by their diffusers/transformers state-dict names, with
names, dtypes and dims but no data: every one is marked with the external-data location
``sdkit:weightset``, the marker ``sdkit.model.strip_weights`` uses. Such a file must be read
with ``load_external_data=False`` (plain ``onnx.load`` would look for a file named
``sdkit:weightset``); ``load_graph`` does that and returns a ``sdkit.model.Graph`` ready for a
``WeightSet`` keyed by those names.

The graphs ship gzip-compressed (14 MB of ONNX, 1.7 MB on disk: most of a graph is repeated
node and tensor names). ``load_graph`` decompresses in memory on each load (about 2 ms per
graph, 45 ms for all of them): no cache file to write, go stale or clean up. A folder of plain
``<name>.onnx`` files (``graphs_dir`` pointed elsewhere, as the benchmarks' ``--graphs`` do)
is read as well.
"""

from __future__ import annotations

import gzip
import os
import zlib
from importlib import resources
from pathlib import Path

import onnx

from sdkit.errors import ModelFormatError
from sdkit.model import Graph

SUFFIXES = (".onnx.gz", ".onnx")  # the shipped form first


def graphs_dir() -> Path:
    return Path(str(resources.files("sdkit.families").joinpath("graphs")))


def _stem(path: Path) -> str | None:
    return next((path.name.removesuffix(s) for s in SUFFIXES if path.name.endswith(s)), None)


def names() -> list[str]:
    """The shipped graphs, e.g. ``sd1_unet``, ``clip_l``, ``vae_decoder``."""
    return sorted({stem for p in graphs_dir().iterdir() if (stem := _stem(p)) is not None})


def graph_path(name: str) -> Path:
    """The file of a shipped graph (``<name>.onnx.gz``; ``<name>.onnx`` in a plain folder)."""
    for suffix in SUFFIXES:
        path = graphs_dir() / f"{name}{suffix}"
        if path.is_file():
            return path
    raise ModelFormatError(f"no shipped graph {name!r}; sdkit ships {', '.join(names())}")


def graph_bytes(name_or_path: str | os.PathLike[str]) -> bytes:
    """The ONNX bytes of a shipped graph by name, or of a ``.onnx`` / ``.onnx.gz`` file."""
    path = Path(name_or_path)
    if _stem(path) is None:
        path = graph_path(str(name_or_path))
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if path.name.endswith(".gz") else data
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ModelFormatError(f"{path.name} is not a readable ONNX graph: {exc}") from None


def load_graph(name_or_path: str | os.PathLike[str]) -> Graph:
    """A shipped graph by name, or any weightless ``.onnx`` (or gzip'd ``.onnx.gz``) file
    written the same way."""
    data = graph_bytes(name_or_path)
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf DecodeError
        raise ModelFormatError(f"{Path(name_or_path).name} is not a readable ONNX graph: {exc}") from None
    return Graph(proto)
