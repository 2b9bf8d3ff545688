"""The weightless architecture graphs shipped in ``sdkit/families/graphs/``.

Each ``<name>.onnx`` holds a real SD-family architecture (see that folder's README.md) whose
initializers are the module's parameters by their diffusers/transformers state-dict names, with
names, dtypes and dims but no data: every one is marked with the external-data location
``sdkit:weightset``, the marker ``sdkit.model.strip_weights`` uses. Such a file must be read
with ``load_external_data=False`` (plain ``onnx.load`` would look for a file named
``sdkit:weightset``); ``load_graph`` does that and returns a ``sdkit.model.Graph`` ready for a
``WeightSet`` keyed by those names.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import onnx

from sdkit.errors import ModelFormatError
from sdkit.model import Graph


def graphs_dir() -> Path:
    return Path(str(resources.files("sdkit.families").joinpath("graphs")))


def names() -> list[str]:
    """The shipped graphs, e.g. ``sd1_unet``, ``clip_l``, ``vae_decoder``."""
    return sorted(p.stem for p in graphs_dir().glob("*.onnx"))


def graph_path(name: str) -> Path:
    path = graphs_dir() / f"{name}.onnx"
    if not path.is_file():
        raise ModelFormatError(f"no shipped graph {name!r}; sdkit ships {', '.join(names())}")
    return path


def load_graph(name_or_path: str | os.PathLike[str]) -> Graph:
    """A shipped graph by name, or any weightless ``.onnx`` file written the same way."""
    path = Path(name_or_path)
    if path.suffix != ".onnx":
        path = graph_path(str(name_or_path))
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError
        raise ModelFormatError(f"{path.name} is not a readable ONNX graph: {exc}") from None
    return Graph(proto)
