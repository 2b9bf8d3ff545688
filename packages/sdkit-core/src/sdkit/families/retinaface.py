"""RetinaFace face-detector files (facexlib's ``detection_Resnet50_Final.pth`` and
``detection_mobilenet0.25_Final.pth``, converted to ``.safetensors``): the backbone read from the
file's keys and shapes, the weights filling a shipped weightless graph.

facexlib's ``RetinaFace`` (``facexlib/detection/retinaface.py``, the detector A1111's face
restoration runs through ``FaceRestoreHelper(det_model='retinaface_resnet50')``) is a backbone
(torchvision's ResNet50 up to ``layer4``, or MobileNetV1 x0.25 ``stage1..3``) under ``body.``, an
FPN (``fpn.output1..3``, ``fpn.merge1..2``), three SSH context modules (``ssh1..3``) and per level
class / box / landmark heads (``ClassHead.<i>.conv1x1``, ``BboxHead...``, ``LandmarkHead...``).
The graphs (``graphs/retinaface_resnet50``, ``graphs/retinaface_mobilenet025``, exported from
facexlib's module by ``fixtures/faces/detect/export_retinaface_graphs.py``) hold every
state-dict tensor by its name, BatchNorm running statistics included; ``num_batches_tracked``
(never read in eval mode) is dropped from the file. The released files were saved from
``nn.DataParallel`` (keys under ``module.``): that prefix is dropped, as facexlib's loader does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families import shipped_weights
from sdkit.families.safetensors_reader import SafetensorsFile, TensorEntry
from sdkit.families.shipped import graphs_dir
from sdkit.families.shipped_weights import (
    check_fit,
    find_named_graph,
    initializer_shapes,
    pth_refusal_message,
    shipped_graph_names,
)
from sdkit.model import PICKLED_SUFFIXES, Graph, WeightSet

WRAPPER_PREFIXES = ("module.", "params_ema.", "params.")
UNUSED_SUFFIX = ".num_batches_tracked"
_HEADS = ("ClassHead.0.conv1x1.weight", "BboxHead.0.conv1x1.weight", "LandmarkHead.0.conv1x1.weight")
# backbone -> (a key only it has, FPN width, the first FPN lateral's input channels)
_BACKBONES = {
    "resnet50": ("body.layer4.2.conv3.weight", 256, 512),
    "mobilenet0.25": ("body.stage3.1.3.weight", 64, 64),
}


@dataclass(frozen=True)
class RetinaFaceConfig:
    """A RetinaFace file's backbone: ``resnet50`` or ``mobilenet0.25`` (facexlib's configs
    ``cfg_re50`` / ``cfg_mnet``: the same prior boxes and variances, other widths)."""

    backbone: str

    @property
    def graph_name(self) -> str:
        return "retinaface_resnet50" if self.backbone == "resnet50" else "retinaface_mobilenet025"

    def describe(self) -> str:
        return f"RetinaFace ({'ResNet50' if self.backbone == 'resnet50' else 'MobileNet0.25'})"


def strip_wrapper(keys: Iterable[str]) -> dict[str, str]:
    """file key -> key without a training wrapper's prefix (when every key carries it)."""
    return shipped_weights.strip_wrapper(keys, WRAPPER_PREFIXES)


def sniff(shapes: Mapping[str, tuple[int, ...]]) -> RetinaFaceConfig | None:
    """The file's config if these keys/shapes are a RetinaFace detector's, else None (never
    raises for a foreign file)."""
    try:
        named = {key: tuple(shapes[file_key]) for file_key, key in strip_wrapper(shapes).items()}
        if not all(k in named for k in _HEADS) or "fpn.output1.0.weight" not in named:
            return None
        for backbone, (marker, width, lateral) in _BACKBONES.items():
            if marker not in named:
                continue
            heads_ok = named[_HEADS[0]] == (4, width, 1, 1) and named[_HEADS[2]] == (20, width, 1, 1)
            if heads_ok and named["fpn.output1.0.weight"] == (width, lateral, 1, 1):
                return RetinaFaceConfig(backbone)
        return None
    except (TypeError, ValueError, AttributeError):
        return None


def pth_refusal(name: str) -> str:
    """Why a RetinaFace ``.pth`` is refused, and the one-line conversion."""
    return pth_refusal_message(name, "face-detector files", key="k.removeprefix('module.')")


def retinaface_graph_names() -> list[str]:
    """The shipped RetinaFace graphs."""
    return shipped_graph_names(graphs_dir(), ("retinaface_",))


def find_graph(config: RetinaFaceConfig, folders: Iterable[str | os.PathLike[str]] = ()) -> Graph:
    """The weightless graph of ``config``: from ``folders`` (first) or the shipped ones."""
    graph = find_named_graph(config.graph_name, [*folders, graphs_dir()])
    if graph is not None:
        return graph
    raise ModelFormatError(f"no graph for {config.describe()}; sdkit ships {', '.join(retinaface_graph_names())}")


class RetinaFaceFile:
    """A RetinaFace ``.safetensors`` file: its backbone now, its weights (under the graph's
    names, float32) on ``weights()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() in PICKLED_SUFFIXES:
            raise ModelFormatError(pth_refusal(self.path.name))
        if not self.path.is_file():
            raise ModelFormatError(f"face-detector file not found: {self.path}")
        self.file = SafetensorsFile(self.path)
        shapes = {k: e.shape for k, e in self.file.entries.items()}
        config = sniff(shapes)
        if config is None:
            self.file.close()
            raise ModelFormatError(
                f"{self.path.name}: not a RetinaFace file (facexlib's detection_Resnet50_Final or "
                f"detection_mobilenet0.25_Final: body.*, fpn.*, ssh1..3.*, ClassHead/BboxHead/LandmarkHead.* "
                f"keys expected); found {', '.join(sorted(shapes)[:4])}..."
            )
        self.config = config
        self.names = strip_wrapper(self.file.entries)

    def entries(self) -> dict[str, TensorEntry]:
        """Graph name -> the file's tensor entry (``num_batches_tracked`` left out)."""
        return {self.names[k]: e for k, e in self.file.entries.items() if not self.names[k].endswith(UNUSED_SUFFIX)}

    def weights(self, graph: Graph) -> WeightSet:
        """The file's tensors as float32 under ``graph``'s initializer names, checked complete."""
        specs = initializer_shapes(graph)
        entries = self.entries()
        check_fit(self.path.name, self.config.describe(), specs, entries)
        return WeightSet({name: self.file.read(entry, np.float32) for name, entry in entries.items()})

    def close(self) -> None:
        self.file.close()
