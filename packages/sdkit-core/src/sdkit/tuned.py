"""The automatic choice for a model whose input shapes are only known when it runs (a pipeline's
components): ``sdkit.compile`` returns a ``ShapeDeferred`` model when ``tune`` asks for
measurement, or when a tune stored timings for this graph, and the choice is made per input
signature at its first run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.device import Device
from sdkit.model import Model, WeightSet
from sdkit.selection import choose, requested_precision
from sdkit.trials import compile_choice
from sdkit.tuning import TuneResult, TuneSettings, shaped, stored_measured, tune

Signature = tuple[tuple[str, tuple[int, ...]], ...]


class ShapeDeferred(CompiledModel):
    """Compiles per input signature at its first run, on the backend ``auto`` picks for those
    shapes. With ``settings`` (``tune=True``), a signature without stored timings is measured
    first, with the real inputs (``results`` keeps each tune); without, stored timings pick the
    measured fastest and a signature nobody tuned takes the priority order, as ``auto`` always
    has. ``backend_name`` and ``device`` are those of the last run."""

    def __init__(
        self, model: Model, device: str | Device | None, options: Mapping[str, Any], settings: TuneSettings | None
    ) -> None:
        self.inputs = model.inputs
        self.outputs = model.outputs
        self.backend_name = ""
        self._model = model
        self._device = device
        self._options = dict(options)
        self._settings = settings
        self._compiled: dict[Signature, CompiledModel] = {}
        self.results: list[TuneResult] = []  # each signature's tune, in order (with settings)

    def _compile_for(self, feeds: Mapping[str, np.ndarray]) -> CompiledModel:
        if self._settings is not None:
            reuse = not self._settings.force
            result = tune(
                self._model,
                feeds=feeds,
                device=self._device,
                options=self._options,
                settings=self._settings,
                reuse=reuse,
                keep=True,
            )
            self.results.append(result)
            assert result.compiled is not None  # keep=True
            return result.compiled
        graph = shaped(self._model.graph, {name: np.shape(value) for name, value in feeds.items()})
        measured = stored_measured(self._model, graph, self._device, self._options)
        choice = choose(graph, "auto", self._device, measured, requested_precision(self._options))
        return compile_choice(choice, graph, self._model.weights, self._options)

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        signature = tuple(sorted((name, tuple(np.shape(value))) for name, value in feeds.items()))
        compiled = self._compiled.get(signature)
        if compiled is None:
            compiled = self._compiled[signature] = self._compile_for(feeds)
        self.backend_name, self.device = compiled.backend_name, compiled.device
        return compiled.run(feeds)

    def refit(self, weights: WeightSet) -> None:
        """Refit every signature compiled so far; one whose backend cannot is released and
        compiles again with the new weights at its next run."""
        self._model = self._model.with_weights(weights)
        for signature, compiled in list(self._compiled.items()):
            try:
                compiled.refit(weights)
            except NotImplementedError:
                compiled.close()
                del self._compiled[signature]

    def close(self) -> None:
        for compiled in self._compiled.values():
            compiled.close()
        self._compiled.clear()
