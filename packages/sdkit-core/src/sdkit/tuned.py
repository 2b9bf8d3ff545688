"""Where tuning applies to ``sdkit.compile(backend="auto")``: ``tune`` asks for measurement, or a
tune stored timings (``auto_compile``). ``sdkit.api`` imports this module, and through it
``sdkit.tuning`` and ``sdkit.trials``, only then: a plain compile never loads them.

A model whose input shapes are only known when it runs (a pipeline's components) becomes a
``ShapeDeferred`` model, and the choice is made per input signature at its first run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.device import Device
from sdkit.model import Graph, Model, WeightSet, fixed_shapes, shaped
from sdkit.selection import Measured, choose, compile_choice, requested_precision
from sdkit.tuning import TuneResult, TuneSettings, stored_measured, tune, tuned_before

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


def auto_compile(
    model: Model,
    graph: Graph,
    input_shapes: Mapping[str, Sequence[int]] | None,
    device: str | Device | None,
    options: Mapping[str, Any],
    tune_with: bool | TuneSettings,
) -> CompiledModel | Measured | None:
    """``compile(backend="auto")``'s tuned part (``sdkit.api.compile`` explains it): a compiled
    model where a tune decides now or per signature, else the stored timings for the priority
    choice to use (None without any). ``graph`` is ``model``'s at ``input_shapes``."""
    settings = tune_with if isinstance(tune_with, TuneSettings) else TuneSettings() if tune_with else None
    if fixed_shapes(graph) is None and (settings is not None or tuned_before(model)):
        return ShapeDeferred(model, device, options, settings)
    if settings is not None:
        found = tune(
            model,
            input_shapes=input_shapes,
            device=device,
            options=options,
            settings=settings,
            reuse=not settings.force,
            keep=True,
        )
        assert found.compiled is not None  # keep=True
        return found.compiled
    return stored_measured(model, graph, device, options)
