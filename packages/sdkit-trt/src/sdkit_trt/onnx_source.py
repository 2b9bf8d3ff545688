"""The ONNX bytes or file that TensorRT's parser and parser-refitter read.

Below protobuf's 2 GB limit the model is serialized in memory (``Graph.to_onnx``). Above
it, the graph goes to a temporary folder with its weights streamed into one external-data
file (no giant ModelProto is built), and the folder is removed afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from sdkit.model import Graph

PROTO_LIMIT = 1_800_000_000  # bytes of weights above which we use external data
WEIGHTS_FILE = "weights.bin"


@dataclass(frozen=True)
class OnnxSource:
    """Either ``data`` (serialized model, ``path`` empty) or ``path`` to a model file."""

    data: bytes
    path: str


def write_external(graph: Graph, weights: Mapping[str, np.ndarray], folder: Path) -> Path:
    """Write ``model.onnx`` + ``weights.bin`` (external data, 64-byte aligned offsets)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.proto)
    offset = 0
    with (folder / WEIGHTS_FILE).open("wb") as out:
        for tensor in proto.graph.initializer:
            array = np.ascontiguousarray(weights[tensor.name])
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            pad = (-offset) % 64
            out.write(b"\0" * pad)
            offset += pad
            out.write(array.tobytes())  # a copy per tensor, never of the whole set
            del tensor.external_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += array.nbytes
    path = folder / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@contextmanager
def onnx_source(graph: Graph, weights: Mapping[str, np.ndarray], limit: int = PROTO_LIMIT) -> Iterator[OnnxSource]:
    """The model as bytes, or as a temporary file for models past the protobuf limit."""
    total = sum(np.asarray(weights[n]).nbytes for n in graph.initializer_names)
    if total <= limit:
        yield OnnxSource(graph.to_onnx(weights).SerializeToString(), "")
        return
    folder = Path(tempfile.mkdtemp(prefix="sdkit-trt-onnx-"))
    try:
        yield OnnxSource(b"", str(write_external(graph, weights, folder)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
