"""``export_mlpackage``: an sdkit model as a Core ML ``.mlpackage`` file, on any OS.

The conversion needs coremltools only (Linux works); running the package needs macOS.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdkit.device import Device
from sdkit.model import Model
from sdkit.options import make_options
from sdkit_coreml.backend import CoremlBackend
from sdkit_coreml.package import convert, describe
from sdkit_coreml.settings import settings_for


def export_mlpackage(
    model: Model,
    path: str | Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Write ``model`` to ``path`` (an ``.mlpackage`` folder) and return ``describe`` of it.

    ``input_shapes`` fixes symbolic dims; options as for ``sdkit.compile(..., backend="coreml")``
    (``precision``, ``target``, ``enumerated_shapes``, ``shape_ranges``)."""
    graph = model.graph
    if input_shapes:
        graph = graph.with_input_shapes({k: tuple(int(d) for d in v) for k, v in input_shapes.items()})
    opts = make_options(options, CoremlBackend.extra_options)
    settings = settings_for(opts, Device("ane"), graph.inputs)
    target = Path(path)
    with tempfile.TemporaryDirectory(prefix="sdkit-coreml-") as scratch:
        package = convert(graph, model.weights, settings, Path(scratch))
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(package.path, target)
    info = describe(target)
    info["convert_seconds"] = package.seconds
    return info
