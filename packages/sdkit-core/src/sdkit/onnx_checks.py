"""What core refuses in an ONNX model before any backend sees it, for every backend alike.

- **Opsets newer than this sdkit knows.** An operator's meaning at an unknown opset is unknown
  (onnxruntime refuses such models too), so ``ai.onnx`` / ``ai.onnx.ml`` versions above the
  installed onnx's newest are an error naming that newest version.
- **External data at special locations.** Runtimes give some locations a meaning of their own:
  ``*/_ORT_MEM_ADDR_/*`` tells onnxruntime and OpenVINO that ``offset`` is an address in this
  process's memory, so a model file could make a backend read arbitrary memory. Such locations,
  absolute paths and paths leaving the model's folder (symlinks resolved) are refused in every
  tensor of the model (initializers, sparse initializers, Constant and other attribute tensors,
  dense or sparse, in subgraphs and functions too), before any data is read.
- **Node attributes backends read differently, and nesting they pay too much for.** A
  convolution's ``group`` below 1, and If/Loop/Scan nested deeper than ``MAX_SUBGRAPH_DEPTH``.
- **Tensors still external after loading.** onnx loads the external data of dense tensors
  only; a sparse tensor (or a model built in memory) that still points outside the file is
  refused rather than handed to a runtime that would resolve it its own way.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import AttributeProto, GraphProto, TensorProto

from sdkit.errors import ModelFormatError
from sdkit.files import inside

# Locations with a meaning beyond "a file beside the model" in some runtime.
MEMORY_MARKER = "_ORT_MEM_ADDR_"
STRIPPED_MARKER = "sdkit:weightset"  # sdkit's own mark for weights kept in a WeightSet


@functools.cache
def newest_opsets() -> dict[str, int]:
    """The newest opset of each standard domain the installed onnx defines."""
    newest = {"": int(onnx.defs.onnx_opset_version())}
    try:  # {domain: (oldest, newest)} of every domain onnx defines
        versions = onnx.defs.C.schema_version_map()
    except AttributeError:  # pragma: no cover - an onnx without it: the main domain only
        versions = {}
    for domain, (_, latest) in versions.items():
        newest[domain] = int(latest)
    return newest


def check_opsets(proto: onnx.ModelProto, name: str = "the model") -> None:
    """Refuse standard-domain opsets newer than this onnx knows (or below 1)."""
    newest = newest_opsets()
    imports = [*proto.opset_import, *(e for f in proto.functions for e in f.opset_import)]
    for entry in imports:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        if domain not in newest:
            continue  # a custom domain: its versions are its own, backends judge its ops
        label = domain or "ai.onnx"
        if entry.version > newest[domain]:
            raise ModelFormatError(
                f"{name} uses opset {entry.version} of {label}, newer than any this sdkit supports "
                f"(newest: {newest[domain]}, from onnx {onnx.__version__}); export it with opset <= {newest[domain]}"
            )
        if entry.version < 1:
            raise ModelFormatError(f"{name} imports opset {entry.version} of {label}")


def check_declared_dims(proto: onnx.ModelProto, name: str = "the model") -> None:
    """Refuse negative declared dims on the graph's inputs, outputs and value infos (a backend
    would take them for sizes)."""
    graph = proto.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.WhichOneof("value") != "tensor_type":
            continue
        dims = value.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
            shown = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in dims]
            raise ModelFormatError(f"{name}: {value.name!r} declares a negative dimension {shown}")


MAX_SUBGRAPH_DEPTH = 12  # If/Loop/Scan nested in one another; exported diffusion models use 0-2
_GROUPED = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv"})


def _nodes(graph: GraphProto, depth: int = 0) -> Iterator[tuple[onnx.NodeProto, int]]:
    """Every node of ``graph`` and of its subgraphs, with its subgraph nesting depth."""
    for node in graph.node:
        yield node, depth
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == AttributeProto.GRAPH else attr.graphs:
                yield from _nodes(sub, depth + 1)


def check_nodes(proto: onnx.ModelProto, name: str = "the model") -> None:
    """Refuse what the checker lets through but backends read differently or pay too much for:
    a convolution's ``group`` below 1 (OpenVINO computed group=1, others divide by it), and
    control flow nested deeper than ``MAX_SUBGRAPH_DEPTH`` (OpenVINO's compile time doubles with
    each level of ``If``: a 2.5 kB model took 50 s at depth 21)."""
    graphs = [(proto.graph, "")] + [(GraphProto(node=f.node), f"function {f.name!r}: ") for f in proto.functions]
    for graph, scope in graphs:
        for node, depth in _nodes(graph):
            label = f"{scope}node {node.name or node.op_type!r}"
            if depth > MAX_SUBGRAPH_DEPTH:
                raise ModelFormatError(
                    f"{name}: {label} sits {depth} subgraphs deep (If/Loop/Scan nested in one another); "
                    f"at most {MAX_SUBGRAPH_DEPTH} are accepted (compile time grows exponentially with it)"
                )
            if node.op_type in _GROUPED and node.domain in ("", "ai.onnx", "com.microsoft"):
                group = next((a.i for a in node.attribute if a.name == "group"), 1)
                if group < 1:
                    raise ModelFormatError(f"{name}: {label} ({node.op_type}) has group={group}; it must be at least 1")


def _sparse(where: str, sparse: onnx.SparseTensorProto) -> Iterator[tuple[str, TensorProto]]:
    yield f"{where} (sparse values)", sparse.values
    yield f"{where} (sparse indices)", sparse.indices


def _graph_tensors(graph: GraphProto, scope: str = "", initializers: bool = True) -> Iterator[tuple[str, TensorProto]]:
    for tensor in graph.initializer if initializers else ():
        yield f"{scope}initializer {tensor.name!r}", tensor
    for sparse in graph.sparse_initializer:
        yield from _sparse(f"{scope}sparse initializer {sparse.values.name!r}", sparse)
    for node in graph.node:
        yield from _node_tensors(node, scope)


def _node_tensors(node: onnx.NodeProto, scope: str) -> Iterator[tuple[str, TensorProto]]:
    label = f"{scope}node {node.name or node.op_type!r}"
    for attr in node.attribute:
        where = f"{label} attribute {attr.name!r}"
        if attr.type == AttributeProto.TENSOR:
            yield where, attr.t
        elif attr.type == AttributeProto.TENSORS:
            for tensor in attr.tensors:
                yield where, tensor
        elif attr.type == AttributeProto.SPARSE_TENSOR:
            yield from _sparse(where, attr.sparse_tensor)
        elif attr.type == AttributeProto.SPARSE_TENSORS:
            for sparse in attr.sparse_tensors:
                yield from _sparse(where, sparse)
        elif attr.type == AttributeProto.GRAPH:
            yield from _graph_tensors(attr.g, f"{where}: ")
        elif attr.type == AttributeProto.GRAPHS:
            for sub in attr.graphs:
                yield from _graph_tensors(sub, f"{where}: ")


def all_tensors(proto: onnx.ModelProto, initializers: bool = True) -> Iterator[tuple[str, TensorProto]]:
    """Every TensorProto of a model with where it sits: dense and sparse, in the main graph,
    its subgraphs and its functions (without the main graph's dense initializers if not
    ``initializers``: a backend that replaces them with a WeightSet's arrays)."""
    yield from _graph_tensors(proto.graph, initializers=initializers)
    for function in proto.functions:
        for node in function.node:
            yield from _node_tensors(node, f"function {function.name!r} ")


def _location(tensor: TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def check_external_locations(proto: onnx.ModelProto, folder: str | os.PathLike[str], name: str) -> None:
    """Before reading external data: every location is a plain relative path to a regular file
    inside ``folder`` (symlinks resolved), never a location a runtime gives a special meaning."""
    for where, tensor in all_tensors(proto):
        if not is_external(tensor):
            continue
        location = _location(tensor)
        special = MEMORY_MARKER in location or location.startswith("*") or location == STRIPPED_MARKER
        if special or not location or "\0" in location:
            raise ModelFormatError(f"{name}: {where} has external data at the refused location {location!r}")
        if Path(location).is_absolute() or location.startswith(("/", "\\")):
            raise ModelFormatError(f"{name}: {where} has external data at an absolute path {location!r} (refused)")
        target = inside(folder, location, f"{name}: {where}: external data")
        if not target.is_file():
            raise ModelFormatError(f"{name}: {where}: external data file {location!r} not found")


def refuse_external(proto: onnx.ModelProto, name: str = "the model", initializers: bool = True) -> None:
    """After loading: no tensor may still point outside the model (see the module docstring).
    ``initializers=False`` skips the main graph's dense initializers (a Graph's are stripped,
    their values are in its WeightSet)."""
    for where, tensor in all_tensors(proto, initializers):
        if is_external(tensor):
            raise ModelFormatError(
                f"{name}: {where} still points at external data {_location(tensor)!r} "
                "(external data is read only for dense tensors, from files beside the model)"
            )
