"""What the single-network stages (model upscalers, GFPGAN, CodeFormer, RetinaFace, ParseNet)
share: a file's weights filling the shipped weightless graph of its configuration, then that
model compiled on a backend.

    class ParseNetParser(ShippedNetwork):
        def __init__(self, path, backend="auto", device=None, *, graphs=(), **options):
            with closing(ParseNetFile(path)) as file:
                model = self.fill(file, find_graph, graphs, path)   # sets .config and .path
            self.compiled = compile_network(model, "face parser", backend, device, options)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from sdkit.api import compile as compile_model
from sdkit.backend import CompiledModel
from sdkit.model import Graph, Model, WeightSet
from sdkit.pipelines.stages.phases import report

Graphs = Iterable[str | os.PathLike[str]]
C = TypeVar("C")


class NetworkFile(Protocol):
    """A family's file (``sdkit.families.upscalers.UpscalerFile``, ``GFPGANFile``...)."""

    @property
    def config(self) -> Any: ...

    def weights(self, graph: Graph) -> WeightSet: ...


def file_model(
    file: NetworkFile, find_graph: Callable[[Any, Graphs], Graph], graphs: Graphs, path: str | os.PathLike[str]
) -> Model:
    """The graph ``find_graph`` gives for the file's configuration (``graphs`` first), with the
    file's weights (the caller closes the file)."""
    graph = find_graph(file.config, graphs)
    return Model(graph, file.weights(graph), Path(path))


def compile_network(
    model: Model, component: str, backend: str, device: str | None, options: Mapping[str, Any]
) -> CompiledModel:
    """``model`` compiled on ``backend``, announced as the ``component``'s compile phase."""
    report("compile", component)
    return compile_model(model, backend=backend, device=device, **options)


def backend_name(compiled: CompiledModel) -> str:
    """The backend a network was compiled on."""
    return str(getattr(compiled, "backend_name", "") or type(compiled).__name__)


class ShippedNetwork(Generic[C]):
    """Base of a stage that runs one file's network: ``fill`` keeps the file's configuration and
    path and gives its model, the subclass compiles it into ``compiled``; ``backend`` names where
    it runs; ``C``, the family's configuration type."""

    config: C
    path: Path
    compiled: CompiledModel

    def fill(
        self,
        file: NetworkFile,
        find_graph: Callable[[Any, Graphs], Graph],
        graphs: Graphs,
        path: str | os.PathLike[str],
    ) -> Model:
        """``file_model`` of the open ``file``, its configuration and path kept on the stage."""
        self.config, self.path = file.config, Path(path)  # a family file's config is a C
        return file_model(file, find_graph, graphs, path)

    @property
    def backend(self) -> str:
        return backend_name(self.compiled)
