"""``GgmlCompiledModel``: compiles lazily per input signature, reuses, refits weights."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.backend import CompiledModel, TensorInfo, check_feeds
from sdkit.engine_cache import EngineCache
from sdkit.errors import InputError, UnsupportedModelError
from sdkit.options import physical_cores
from sdkit_ggml.compiler.build import BACKEND, Plan, build_plan, capacity_for, replay_constants
from sdkit_ggml.compiler.builder import Builder
from sdkit_ggml.compiler.context import NeedsValue, Tensor, WeightEntry
from sdkit_ggml.compiler.conv_strategy import ConvChooser, Timer, conv_mode
from sdkit_ggml.compiler.lowering_modes import (
    attention_patterns,
    f16_activations,
    f16_activations_mode,
    flash_attn_mode,
    matmul_prec_mode,
)
from sdkit_ggml.compiler.passes import apply_passes
from sdkit_ggml.runtime.context import GgmlContext
from sdkit_ggml.runtime.devices import compute_lock
from sdkit_ggml.runtime.program import BuiltGraph, Program

if TYPE_CHECKING:
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options
    from sdkit_ggml.compiler.registry import ConverterRegistry
    from sdkit_ggml.runtime.lib import GgmlLib

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


@dataclass(frozen=True)
class BuildRecord:
    """One input signature's graph, built once and reused by every later run with that
    signature: its seconds per stage (``lower``: ONNX nodes to ggml tensors, constant folding
    included; ``graph``, ``weights``, ``allocate``: ``Program``'s) and its ggml node count."""

    signature: Signature
    seconds: dict[str, float]
    nodes: int


class GgmlCompiledModel(CompiledModel):
    def __init__(
        self,
        graph: Graph,
        weights: WeightSet,
        device: Device,
        options: Options,
        *,
        lib: GgmlLib,
        backend: int,
        registry: ConverterRegistry,
        conv_timer: Timer | None = None,
    ) -> None:
        """``conv_timer``: measures a conv shape's strategies under ``conv="auto"``
        (``sdkit_ggml.conv_tuning.ConvTuner``); without one, auto takes im2col."""
        self.graph = graph
        self.flash_attn = flash_attn_mode(options.extra.get("flash_attn"))
        f16_mode = f16_activations_mode(options.extra.get("f16_activations"))
        self.f16_activations = f16_activations(f16_mode, options.precision, device.kind)
        self.matmul_prec = matmul_prec_mode(options.extra.get("matmul_prec"))
        # what is lowered, for every signature and refit
        self._proto = apply_passes(graph.proto, attention=attention_patterns(self.flash_attn, options.precision))
        self.inputs: list[TensorInfo] = graph.inputs
        self.outputs: list[TensorInfo] = graph.outputs
        self.device = device
        self.options = options
        self.threads = options.threads or physical_cores()
        self._lib = lib
        self._backend = backend
        self._registry = registry
        self._constants = self._initializers(weights)
        # One program per signature, built once (sdkit.engine_cache); its lock also guards
        # _shared_weights, which builds update.
        self._programs: EngineCache[Signature, tuple[Plan, Program]] = EngineCache()
        self.builds: list[BuildRecord] = []  # one per signature built, in order
        self._shared_weights: dict[tuple[str, str], Tensor] = {}
        mode = conv_mode(options.extra.get("conv"))
        self.conv = ConvChooser(mode, lib.has("ggml_conv_2d_direct"), conv_timer if mode == "auto" else None)
        self._run_lock = compute_lock(backend)
        # Inputs used as shapes/axes: their values become part of the signature.
        self._value_inputs: set[str] = set()
        static = all(isinstance(d, int) and d >= 0 for i in self.inputs for d in i.shape)
        if static:  # report problems at compile time when the signature is already known
            specs = {i.name: (tuple(int(d) for d in i.shape if isinstance(d, int)), i.dtype) for i in self.inputs}
            try:
                self._program(specs, {})
            except NeedsValue as need:
                self._value_inputs.add(need.name)

    def _device_supports(self, node: int) -> bool:
        return bool(self._lib.ggml_backend_supports_op(self._backend, node))

    def _initializers(self, weights: WeightSet) -> dict[str, np.ndarray]:
        names = self.graph.initializer_names
        missing = sorted(n for n in names if n not in weights)
        if missing:
            raise InputError(f"weights are missing {len(missing)} initializer(s), e.g. {missing[0]!r}")
        return {name: np.asarray(weights[name]) for name in names}

    @property
    def signatures(self) -> list[Signature]:
        return list(self._programs)

    def program_for(self, feeds: Mapping[str, np.ndarray]) -> Program:
        """The allocated ggml program that runs ``feeds`` (built now if their shapes are new):
        what ``sdkit_ggml.runtime.profile.profile_program`` times node by node."""
        checked = check_feeds(self.inputs, feeds)
        specs = {i.name: (tuple(checked[i.name].shape), checked[i.name].dtype) for i in self.inputs}
        return self._program(specs, checked)

    def prepare(self, input_shapes: Mapping[str, Sequence[int]]) -> bool:
        """Build the graph for these input shapes now, without computing (a warm-up before the
        first run, e.g. at a pipeline's load): the first run with them then only computes. False
        where the graph's structure depends on an input's values (a shape or axes given as an
        input): that signature is built at its first run, with the values."""
        names = [i.name for i in self.inputs]
        wrong = sorted(set(input_shapes) ^ set(names))
        if wrong:
            raise InputError(f"prepare: a shape for each input, {', '.join(names)}; got {sorted(input_shapes)}")
        feeds = {i.name: np.zeros(tuple(int(d) for d in input_shapes[i.name]), dtype=i.dtype) for i in self.inputs}
        checked = check_feeds(self.inputs, feeds)  # missing, wrong-rank or fixed-dim shapes: InputError
        if self._value_inputs:
            return False
        specs = {i.name: (tuple(checked[i.name].shape), checked[i.name].dtype) for i in self.inputs}
        try:
            self._program(specs, {})
        except NeedsValue:
            return False
        return True

    def _program(
        self, specs: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]], feeds: Mapping[str, np.ndarray]
    ) -> Program:
        while True:
            try:
                return self._build(specs, feeds)
            except NeedsValue as need:
                if need.name in self._value_inputs or need.name not in feeds:
                    raise
                self._value_inputs.add(need.name)

    def _build(
        self, specs: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]], feeds: Mapping[str, np.ndarray]
    ) -> Program:
        values = {n: np.array(feeds[n], copy=True) for n in sorted(self._value_inputs)}
        signature: Signature = tuple((n, tuple(s), str(d)) for n, (s, d) in specs.items()) + tuple(
            (n, tuple(v.shape), v.tobytes().hex()) for n, v in values.items()
        )
        return self._programs.get_or_build(signature, lambda key: self._new_program(key, specs, values))[1]

    def _new_program(
        self,
        signature: Signature,
        specs: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
        values: dict[str, np.ndarray],
    ) -> tuple[Plan, Program]:
        """Lower the graph for one signature (under the program cache's lock)."""
        context = GgmlContext(self._lib, capacity_for(self._proto))
        builder = Builder(context, self.options.precision, self._shared_weights)
        builder.conv_choice = self.conv
        builder.f16_activations = self.f16_activations
        builder.mul_mat_prec_f32 = self.matmul_prec == "f32"
        builder.device_supports = self._device_supports
        builder.has_function = self._lib.has
        start = time.perf_counter()
        try:
            plan = build_plan(self._proto, self._constants, specs, self._registry, builder, value_inputs=values)
            lowered = time.perf_counter() - start
            # an input also computed on as integers is never wrapped: its negatives are refused
            ranged = builder.input_ranges
            wraps = {name for name, dims in builder.index_dims.items() if len(dims) == 1 and name not in ranged}
            runnable = BuiltGraph(
                context, plan.inputs, plan.outputs, builder.weights, builder.index_bounds, wraps, dict(ranged)
            )
            program = Program(self._lib, self._backend, runnable, self.threads)
        except BaseException:
            context.free()
            raise
        # Programs live as long as this model, so later signatures may use these weights;
        # only those computed from weights alone (other folded values depend on input shapes).
        shareable = builder.weight_derived
        self._shared_weights.update({k: v for k, v in builder.weight_cache.items() if k[0] in shareable})
        self.builds.append(BuildRecord(signature, {"lower": lowered, **program.seconds}, program.nodes))
        return plan, program

    def execute(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        specs = {i.name: (tuple(feeds[i.name].shape), feeds[i.name].dtype) for i in self.inputs}
        program = self._program(specs, feeds)
        # A program's input, output and intermediate tensors are shared by its runs.
        with self._run_lock:
            return program.run(feeds, self.threads)

    def refit(self, weights: WeightSet) -> None:
        """Re-upload every weight (re-running compile-time folding and weight preprocessing)."""
        constants = self._initializers(weights)
        for name, array in constants.items():
            previous = self._constants[name]
            if array.shape != previous.shape or array.dtype != previous.dtype:
                raise InputError(
                    f"refit: weight {name!r} is {array.dtype}{list(array.shape)}, "
                    f"the model has {previous.dtype}{list(previous.shape)}"
                )
        updates = [(plan, program, self._refit_entries(plan, constants)) for plan, program in self._programs.values()]
        with self._run_lock:  # never upload under a running compute
            for plan, program, entries in updates:
                program.upload(entries)
                refittable = [e for e in plan.builder.weights if e.source is not None]
                for entry, new in zip(refittable, entries, strict=True):
                    entry.array = new.array
            self._constants = constants

    def _refit_entries(self, plan: Plan, constants: dict[str, np.ndarray]) -> list[WeightEntry]:
        """The new value of every refittable weight of one signature's graph."""
        values = replay_constants(plan, self._proto, constants)
        for name, before in plan.builder.structural.items():
            now = values.get(name)
            if now is None or now.shape != before.shape or not np.array_equal(now, before):
                raise UnsupportedModelError(
                    BACKEND, [f"refit: {name!r} changed, and the graph's structure depends on it; compile again"]
                )
        entries = []
        for entry in plan.builder.weights:
            if entry.source is None:
                continue
            raw = values[entry.source]
            array = entry.transform(raw) if entry.transform is not None else raw
            if array.shape != entry.array.shape:
                raise InputError(f"refit: {entry.source!r} changes shape")
            entries.append(WeightEntry(entry.tensor, entry.source, array, entry.transform))
        return entries

    def memory(self) -> dict[str, int]:
        """Device bytes of the weights and of the compute buffers; under precision="q8_0" also
        how many matrix weights are stored quantized and how many stay F16 (``info``)."""
        weights = compute = 0
        for _, program in self._programs.values():
            w, c = program.memory()
            weights, compute = weights + w, compute + c
        result = {"weights": weights, "compute": compute}
        if self.options.precision == "q8_0":
            info = self.info
            result.update(quantized_weights=len(info["quantized"]), unquantized_weights=len(info["unquantized"]))
        return result

    @property
    def info(self) -> dict[str, Any]:
        """The precision; the conv strategy asked for (``conv``), the one each conv shape got
        (``conv_strategies``: shape -> im2col or direct) and, under ``conv="auto"``, the
        seconds measured per strategy (``conv_timings``); under "q8_0" the matrix weights stored
        as Q8_0 (``quantized``) and those kept at F16 because their rows are not whole 32-weight
        blocks (``unquantized``), each as graph value name -> stored shape (rows last);
        ``conv_concat``: how many convs of a concat (pass conv_concat) were split into one
        product per part (``split``) or lowered as Concat + Conv (``concat_conv``), over the
        signatures built.
        Conv kernels stay F16 (counted in neither: ggml reads a quantized operand only as mul_mat's first argument)."""
        quantized: dict[str, tuple[int, ...]] = {}
        kept: dict[str, tuple[int, ...]] = {}
        conv_concat = {"split": 0, "concat_conv": 0}
        for plan, _ in self._programs.values():
            quantized.update(plan.builder.quantized)
            kept.update(plan.builder.kept)
            for key, count in plan.builder.conv_concat.items():
                conv_concat[key] += count
        return {
            "precision": self.options.precision,
            "quantized": quantized,
            "unquantized": kept,
            "conv": self.conv.mode,
            "conv_strategies": dict(self.conv.choices),
            "conv_timings": {k: dict(v) for k, v in self.conv.timings.items()},
            "conv_concat": conv_concat,
            "flash_attn": self.flash_attn,
            "f16_activations": self.f16_activations,
            "matmul_prec": self.matmul_prec,
        }

    def close(self) -> None:
        self._programs.clear(self._free)
        self._shared_weights.clear()

    def _free(self, built: tuple[Plan, Program]) -> None:
        with self._run_lock:  # never free buffers under a running compute
            built[1].close()


__all__ = ["BuildRecord", "GgmlCompiledModel"]
