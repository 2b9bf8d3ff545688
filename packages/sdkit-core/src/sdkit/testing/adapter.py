"""Any sdkit backend as an ``onnx.backend.base.Backend``, for ``onnx.backend.test``.

Exclusions live in a data file, grouped by reason:

    ## ggml has no float64 tensors
    test_.*_double_
    test_cast_FLOAT_to_DOUBLE

    ## [cpu lacks avx512bw avx_ne_convert] OpenVINO's bf16 attention without native bf16 is wrong
    ^test_attention_4d_causal_padded_kv_bf16_cpu$

A line starting ``##`` opens a group and states its reason; each following non-empty line
is a regular expression searched in the test name; a lone ``#`` starts a comment. Every
pattern must sit under a reason.

A reason may start with a CPU condition in brackets, for results that depend on the
instruction set (bf16, fp16, AMX kernels): ``[cpu lacks A B]`` applies the group only on a CPU
with none of the flags A, B; ``[cpu has A B]`` only on one with at least one of them (the two
are each other's opposite). Flags are Linux ``/proc/cpuinfo`` names, as ``sdkit.cpu_features``
reads them (``ONEDNN_MAX_CPU_ISA`` included); a flag that cannot be read counts as absent.
"""

from __future__ import annotations

import os
import re
import time
import unittest
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.device import Device
from sdkit.errors import SdkitError

_ONNX_DEVICES = {"CPU": "cpu", "CUDA": "cuda"}
_CPU_CONDITION = re.compile(r"\[cpu (has|lacks) ([a-z0-9_ ,]+)\]\s*(.*)")


def _applies(reason: str, cpu_flags: frozenset[str], where: str) -> bool:
    """Whether a group whose reason is ``reason`` applies on a CPU with ``cpu_flags``."""
    if not reason.startswith("["):
        return True
    match = _CPU_CONDITION.fullmatch(reason)
    if match is None or not match.group(3):
        raise ValueError(f"{where}: expected '## [cpu has|lacks FLAG ...] reason', got {reason!r}")
    verb, flags = match.group(1), set(match.group(2).replace(",", " ").split())
    present = bool(flags & cpu_flags)
    return present if verb == "has" else not present


def load_exclusions(path: str | os.PathLike[str], cpu_flags: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(pattern, reason) pairs from an exclusion file, for this CPU (or one with ``cpu_flags``):
    groups whose CPU condition does not hold here are left out."""
    if cpu_flags is None:
        from sdkit.cpu_features import cpu_info

        cpu_flags = cpu_info().flags
    flags = frozenset(f.lower() for f in cpu_flags)
    pairs: list[tuple[str, str]] = []
    reason, applies = "", True
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("##")):
            continue
        if line.startswith("##"):
            reason = line[2:].strip()
            if not reason:
                raise ValueError(f"{path}:{number}: a '##' group needs a reason")
            applies = _applies(reason, flags, f"{path}:{number}")
            continue
        if not reason:
            raise ValueError(f"{path}:{number}: pattern {line!r} has no '##' reason above it")
        re.compile(line)
        if applies:
            pairs.append((line, reason))
    return pairs


def onnx_backend(name: str, device: str | None = None, **options: Any) -> type:
    """An ``onnx.backend.base.Backend`` subclass that compiles through sdkit backend ``name``."""
    import onnx
    from onnx.backend.base import Backend as OnnxBackend
    from onnx.backend.base import BackendRep

    import sdkit
    from sdkit.model import Model

    fixed = Device.parse(device) if device else None

    class Rep(BackendRep):
        def __init__(self, compiled: sdkit.CompiledModel) -> None:
            self.compiled = compiled

        def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
            names = [i.name for i in self.compiled.inputs]
            if isinstance(inputs, dict):
                feeds = dict(inputs)
            else:
                values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
                feeds = dict(zip(names, values, strict=False))
            outputs = self.compiled.run(feeds)
            return tuple(outputs[o.name] for o in self.compiled.outputs)

    class SdkitOnnxBackend(OnnxBackend):
        backend_name = name

        @classmethod
        def _device(cls, onnx_device: str) -> Device:
            kind = str(onnx_device).split(":")[0].upper()
            return fixed or Device(_ONNX_DEVICES.get(kind, kind.lower()))

        @classmethod
        def supports_device(cls, device: str) -> bool:
            kind = _ONNX_DEVICES.get(str(device).split(":")[0].upper())
            if kind is None:
                return False
            if fixed is not None:
                return fixed.kind == kind
            return kind == "cpu"

        @classmethod
        def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
            return True  # strict: an unsupported node must fail or be excluded, never skip

        @classmethod
        def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> Rep:
            loaded = Model.from_proto(model)
            compiled = sdkit.compile(loaded, backend=name, device=cls._device(device), **options)
            return Rep(compiled)

        @classmethod
        def run_model(
            cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
        ) -> tuple[np.ndarray, ...]:
            return cls.prepare(model, device).run(inputs)

    SdkitOnnxBackend.__name__ = f"SdkitOnnxBackend_{name}"
    return SdkitOnnxBackend


@dataclass
class ConformanceResult:
    """Outcome of a conformance run: names per outcome, with the first line of each error."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def executed(self) -> int:
        return len(self.passed) + len(self.failed)

    def summary(self) -> str:
        return (
            f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.excluded)} excluded, "
            f"{len(self.skipped)} skipped in {self.seconds:.1f}s"
        )


def _test_name(test: unittest.TestCase) -> str:
    return test.id().rsplit(".", 1)[-1]


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_conformance(
    name: str,
    exclusions: str | os.PathLike[str] | None = None,
    include: Sequence[str] = (),
    device: str | None = None,
    kinds: Sequence[str] = ("Node",),
    **options: Any,
) -> ConformanceResult:
    """Run ``onnx.backend.test.BackendTest`` (node cases by default) against backend ``name``.

    ``include``: only test names matching one of these regexes. Returns per-case outcomes;
    the caller asserts ``failed`` is empty and ``executed`` is above its minimum.
    """
    import onnx.backend.test

    backend = onnx_backend(name, device=device, **options)
    suite_builder = onnx.backend.test.BackendTest(backend, None)
    excluded_patterns = load_exclusions(exclusions) if exclusions else []
    for pattern in include:
        suite_builder.include(pattern)
    for pattern, _ in excluded_patterns:
        suite_builder.exclude(pattern)
    compiled_excl = [re.compile(p) for p, _ in excluded_patterns]
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case_name, case in suite_builder.test_cases.items():
        if any(case_name == f"OnnxBackend{kind}ModelTest" for kind in kinds):
            suite.addTests(loader.loadTestsFromTestCase(case))
    all_names = [_test_name(t) for t in _iter_tests(suite)]
    result = unittest.TestResult()
    start = time.perf_counter()
    suite.run(result)
    outcome = ConformanceResult(seconds=time.perf_counter() - start)
    bad: dict[str, str] = {}
    for test, trace in [*result.failures, *result.errors]:
        bad[_test_name(test)] = _first_line(trace)
    for test, reason in result.skipped:
        test_name = _test_name(test)
        if any(p.search(test_name) for p in compiled_excl):
            outcome.excluded.append(test_name)
        else:
            outcome.skipped[test_name] = reason
    outcome.failed = bad
    skipped = set(outcome.excluded) | set(outcome.skipped)
    outcome.passed = [n for n in all_names if n not in bad and n not in skipped]
    return outcome


def _iter_tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    tests: list[unittest.TestCase] = []
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            tests.extend(_iter_tests(item))
        else:
            tests.append(item)
    return tests


__all__ = ["ConformanceResult", "SdkitError", "load_exclusions", "onnx_backend", "run_conformance"]
