"""MIL program -> ``.mlpackage`` on disk (``ct.convert``), in sdkit's artifact cache, and what
a saved package holds (I/O description and the ML program's op histogram).

The package embeds the weights, so the cache key carries the weights hash: a weight swap is
a re-conversion (or a cache hit for weights seen before).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.cache import ArtifactCache, make_key
from sdkit.errors import SdkitError
from sdkit.model import Graph, WeightSet
from sdkit_coreml.program import IoNames, build_program
from sdkit_coreml.runtime import BACKEND_NAME, coremltools_version, first_line, import_coremltools, quiet_conversion
from sdkit_coreml.settings import Flexible, Settings

PACKAGE = "model.mlpackage"
NAMES = "sdkit-coreml.json"
NUMPY_TYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}


@dataclass
class Package:
    """A saved ``.mlpackage`` and the ONNX -> Core ML name mapping beside it."""

    path: Path
    names: IoNames
    seconds: float = 0.0  # conversion time; 0 when it came from the cache
    cached: bool = False


def cache_key(
    graph: Graph, weights: WeightSet, settings: Settings, shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, Any]:
    return make_key(
        graph_hash=graph.hash,
        backend=BACKEND_NAME,
        backend_version=f"coremltools-{coremltools_version()}",
        device="mlprogram",  # one package for every compute unit
        options=settings.key(),
        input_shapes=shapes,
        weights_hash=weights.hash(),
    )


def _input_types(program: Any, names: IoNames, flexible: Mapping[str, Flexible]) -> list[Any]:
    from coremltools.converters.mil.mil.types import builtin_to_string

    ct = import_coremltools()
    types = []
    inputs = program.functions["main"].inputs
    for onnx_name, mil_name in names.inputs.items():
        var = inputs[mil_name]
        dtype = NUMPY_TYPES[builtin_to_string(var.dtype)]
        flex = flexible.get(onnx_name)
        if flex is None:
            shape: Any = tuple(int(d) for d in var.shape)
        elif len(flex.enumerated) == 1:  # Core ML wants two or more enumerated shapes
            shape = flex.enumerated[0]
        elif flex.enumerated:
            shape = ct.EnumeratedShapes(shapes=[list(s) for s in flex.enumerated], default=list(flex.enumerated[0]))
        else:
            pairs = zip(flex.low, flex.high, strict=True)
            dims = [lo if lo == hi else ct.RangeDim(lo, hi, default=lo) for lo, hi in pairs]
            shape = ct.Shape(dims)
        types.append(ct.TensorType(name=mil_name, shape=shape, dtype=dtype))
    return types


def convert(graph: Graph, weights: Mapping[str, np.ndarray], settings: Settings, folder: Path) -> Package:
    """Translate and save ``folder/model.mlpackage`` (plus the name map). Linux and macOS."""
    ct = import_coremltools()
    start = time.perf_counter()
    precision = ct.precision.FLOAT16 if settings.precision == "fp16" else ct.precision.FLOAT32
    try:
        with quiet_conversion():
            program, names = build_program(graph, weights, settings.target)
            model = ct.convert(
                program,
                convert_to="mlprogram",
                minimum_deployment_target=settings.target.mil_opset,
                compute_precision=precision,
                inputs=_input_types(program, names, settings.flexible) if settings.flexible else None,
                skip_model_load=True,
            )
            model.user_defined_metadata["sdkit.graph"] = graph.hash
            model.save(str(folder / PACKAGE))
    except SdkitError:
        raise
    except Exception as exc:
        raise SdkitError(f"coremltools failed to convert the translated program: {first_line(exc)}") from None
    (folder / NAMES).write_text(json.dumps({"inputs": names.inputs, "outputs": names.outputs}, indent=1))
    return Package(folder / PACKAGE, names, time.perf_counter() - start)


def load_names(folder: Path) -> IoNames:
    data = json.loads((folder / NAMES).read_text())
    return IoNames(dict(data["inputs"]), dict(data["outputs"]))


def cached_package(
    graph: Graph,
    weights: WeightSet,
    settings: Settings,
    shapes: Mapping[str, Sequence[int]] | None,
    cache: ArtifactCache | None,
    scratch: Path,
) -> Package:
    """The package from sdkit's artifact cache, converted and stored on a miss. Without a
    cache, converted into ``scratch``."""
    if cache is None:
        scratch.mkdir(parents=True, exist_ok=True)
        return convert(graph, weights, settings, scratch)
    timing: list[float] = []

    def build(folder: Path) -> None:
        timing.append(convert(graph, weights, settings, folder).seconds)

    def load(folder: Path) -> Package:
        if not (folder / PACKAGE).is_dir():
            raise SdkitError("cache entry without a package")
        return Package(folder / PACKAGE, load_names(folder))

    package, cached = cache.load_or_build(cache_key(graph, weights, settings, shapes), build, load)
    package.cached = cached
    package.seconds = timing[0] if timing else 0.0
    return package


def operations(block: Any) -> list[Any]:
    """Every operation of ``block`` and of the blocks nested in its operations (a spec's or a MIL
    program's: both have ``operations`` whose items have ``blocks``)."""
    ops = []
    for op in block.operations:
        ops.append(op)
        for nested in op.blocks:
            ops.extend(operations(nested))
    return ops


def describe(path: Path) -> dict[str, Any]:
    """What a saved package holds, read from its spec (no Core ML runtime needed):
    inputs/outputs (name, dtype, shape, flexible shapes), spec version, op histogram."""
    ct = import_coremltools()
    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    histogram: Counter[str] = Counter()
    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            histogram.update(op.type for op in operations(block))

    def feature(f: Any) -> dict[str, Any]:
        array = f.type.multiArrayType
        info: dict[str, Any] = {
            "name": f.name,
            "dtype": ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(array.dataType).lower(),
            "shape": [int(d) for d in array.shape],
        }
        if array.HasField("shapeRange"):
            info["ranges"] = [(int(r.lowerBound), int(r.upperBound)) for r in array.shapeRange.sizeRanges]
        if array.HasField("enumeratedShapes"):
            info["enumerated"] = [[int(d) for d in s.shape] for s in array.enumeratedShapes.shapes]
        return info

    return {
        "spec_version": int(spec.specificationVersion),
        "inputs": [feature(f) for f in spec.description.input],
        "outputs": [feature(f) for f in spec.description.output],
        "ops": dict(sorted(histogram.items())),
        "metadata": dict(spec.description.metadata.userDefined),
    }
