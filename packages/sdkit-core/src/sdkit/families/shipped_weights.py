"""What the single-network families (upscalers, GFPGAN, CodeFormer, RetinaFace, ParseNet) share
around a shipped weightless graph: dropping a training wrapper's key prefix, finding the graph of
a configuration (a caller's folders first, then the shipped ones), checking a file's tensors
against the graph's initializers, and the message refusing a pickled ``.pth``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from sdkit.errors import ModelFormatError
from sdkit.families.safetensors_reader import TensorEntry
from sdkit.families.shipped import SUFFIXES, load_graph
from sdkit.model import Graph

WRAPPER_PREFIXES = ("params_ema.", "params.", "module.")
# the converted dict of a file that keeps its weights under ``params_ema`` (or ``params``)
SELECT_PARAMS = "d = d.get('params_ema', d.get('params', d)); "


def strip_wrapper(keys: Iterable[str], prefixes: tuple[str, ...] = WRAPPER_PREFIXES) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    keys = list(keys)
    for prefix in prefixes:
        if keys and all(k.startswith(prefix) for k in keys):
            return {k: k[len(prefix) :] for k in keys}
    return {k: k for k in keys}


def pth_refusal_message(name: str, files: str, *, select: str = "", key: str = "k") -> str:
    """Why a pickled ``name`` (``files``: e.g. "upscaler files") is refused, and the one-line
    conversion: ``select`` picks the state dict out of the loaded one, ``key`` renames its keys."""
    stem = Path(name).stem
    return (
        f"{name}: pickled {files} are refused (unpickling can run code); convert it once with "
        f"PyTorch's restricted loader: python -c \"import torch, safetensors.torch as st; "
        f"d = torch.load('{name}', map_location='cpu', weights_only=True); "
        f"{select}"
        f"st.save_file({{{key}: v.contiguous() for k, v in d.items()}}, '{stem}.safetensors')\""
    )


def shipped_graph_names(shipped: Path, prefixes: tuple[str, ...]) -> list[str]:
    """The graphs in ``shipped`` (a family's ``graphs_dir()``) whose names start with one of
    ``prefixes``."""
    found = set()
    for path in shipped.iterdir():
        for suffix in SUFFIXES:
            if path.name.endswith(suffix) and path.name.startswith(prefixes):
                found.add(path.name.removesuffix(suffix))
    return sorted(found)


def find_named_graph(graph_name: str, folders: Iterable[str | os.PathLike[str]]) -> Graph | None:
    """The weightless graph ``graph_name`` from the first of ``folders`` (a caller's, then the
    family's ``graphs_dir()``) that has it; None when none does (the caller says what sdkit ships)."""
    for folder in folders:
        for suffix in SUFFIXES:
            path = Path(folder) / f"{graph_name}{suffix}"
            if path.is_file():
                return load_graph(path)
    return None


def initializer_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """The graph's initializers: name -> shape."""
    return {t.name: tuple(int(d) for d in t.dims) for t in graph.proto.graph.initializer}


def check_fit(
    file_name: str,
    description: str,
    specs: Mapping[str, tuple[int, ...]],
    entries: Mapping[str, TensorEntry],
    unused: tuple[str, ...] = (),
) -> None:
    """A ModelFormatError unless every initializer in ``specs`` is in ``entries`` with its shape
    and every other entry starts with one of ``unused``."""
    missing = sorted(set(specs) - set(entries))
    extra = sorted(k for k in set(entries) - set(specs) if not k.startswith(unused))
    wrong = sorted(k for k in specs if k in entries and entries[k].shape != specs[k])
    if missing or extra or wrong:
        raise ModelFormatError(
            f"{file_name} does not fit the {description} graph: missing {missing[:3]}, "
            f"unexpected {extra[:3]}, wrong shape {wrong[:3]}"
        )
