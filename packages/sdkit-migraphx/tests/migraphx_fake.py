"""A stand-in for ROCm's ``migraphx`` Python module that records every call.

It exists so the plugin's plumbing (option handling, cache keys, the fp16 choice, shapes,
error mapping) is tested on machines without ROCm. It computes nothing: ``program.run``
records its parameters and returns whatever the test put in ``respond`` (clearly a test
double, never a numeric result). The API surface mirrors MIGraphX 2.16's pybind module:
``parse_onnx(filename, map_input_dims=...)``, ``quantize_fp16(prog)``, ``get_target(name)``,
``program.compile(t, offload_copy, fast_math, exhaustive_tune)``, ``save``/``load`` with
``format="msgpack"``, ``program.run({name: array}) -> [argument]``.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from sdkit.device import Device

PARSER_CONTEXT = "/src/AMDMIGraphX/src/onnx/onnx_parser.cpp:625: parse_graph"


class FakeTarget:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeProgram:
    def __init__(self, module: FakeMigraphx, record: dict[str, Any]) -> None:
        self._module = module
        self.record = record  # parameters, outputs, precision, compiled options

    def get_parameter_names(self) -> list[str]:
        return list(self.record["parameters"])

    def get_parameter_shapes(self) -> dict[str, list[int]]:
        return dict(self.record["parameters"])

    def compile(self, t: FakeTarget, offload_copy: bool = True, fast_math: bool = True, exhaustive_tune: bool = False):  # type: ignore[no-untyped-def]
        self._module.log("compile", target=t.name, offload_copy=offload_copy, fast_math=fast_math,
                         exhaustive_tune=exhaustive_tune)  # fmt: skip
        if self._module.compile_error:
            raise RuntimeError(self._module.compile_error)
        self.record["compiled"] = {"target": t.name, "fast_math": fast_math}

    def run(self, params: dict[str, Any]) -> list[np.ndarray]:
        self._module.log("run", params={k: (str(np.asarray(v).dtype), list(np.shape(v))) for k, v in params.items()})
        if self._module.run_error:
            raise RuntimeError(self._module.run_error)
        if "compiled" not in self.record:
            raise RuntimeError("program is not compiled")
        return self._module.respond(params)


class FakeMigraphx(types.ModuleType):
    """The fake module; ``calls`` lists (function, arguments) in order."""

    def __init__(self) -> None:
        super().__init__("migraphx")
        self.__version__ = "2.16.0.fake"
        self.__file__ = "/opt/rocm/lib/migraphx.fake.so"
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.unknown_ops: set[str] = {"MyOp"}
        self.targets = {"gpu", "ref"}
        self.parse_error = ""
        self.compile_error = ""
        self.run_error = ""
        self.respond: Callable[[dict[str, Any]], list[np.ndarray]] = lambda params: []

    def log(self, function: str, **args: Any) -> None:
        self.calls.append((function, args))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def parse_onnx(self, filename: str, map_input_dims: dict[str, list[int]] | None = None, **kw: Any) -> FakeProgram:
        self.log("parse_onnx", filename=filename, map_input_dims=dict(map_input_dims or {}), **kw)
        model = onnx.load(filename)  # weights too: the file must be complete
        for node in model.graph.node:
            if node.op_type in self.unknown_ops:
                raise RuntimeError(f"{PARSER_CONTEXT}: Unknown operator: {node.op_type}")
        if self.parse_error:
            raise RuntimeError(self.parse_error)
        weights = {t.name for t in model.graph.initializer}
        params: dict[str, list[int]] = {}
        for vi in model.graph.input:
            if vi.name in weights:
                continue
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
            params[vi.name] = list((map_input_dims or {}).get(vi.name, dims))
            if 0 in params[vi.name]:
                raise RuntimeError(f"{PARSER_CONTEXT}: dynamic input {vi.name} without map_input_dims")
        record = {"parameters": params, "outputs": [o.name for o in model.graph.output], "precision": "fp32"}
        return FakeProgram(self, record)

    def quantize_fp16(self, prog: FakeProgram, ins_names: list[str] | None = None) -> None:
        self.log("quantize_fp16", compiled="compiled" in prog.record)
        prog.record["precision"] = "fp16"

    def get_target(self, name: str) -> FakeTarget:
        self.log("get_target", target=name)
        if name not in self.targets:
            raise RuntimeError(f"Requested target '{name}' is not loaded or not supported")
        return FakeTarget(name)

    def save(self, p: FakeProgram, filename: str, format: str = "msgpack") -> None:  # noqa: A002 - MIGraphX's name
        self.log("save", filename=filename, format=format)
        Path(filename).write_text(json.dumps(p.record))

    def load(self, filename: str, format: str = "msgpack") -> FakeProgram:  # noqa: A002
        self.log("load", filename=filename, format=format)
        return FakeProgram(self, json.loads(Path(filename).read_text()))


@pytest.fixture
def fake_migraphx(monkeypatch: pytest.MonkeyPatch) -> FakeMigraphx:
    """The fake as ``migraphx`` in sys.modules, and one AMD GPU (gfx1100) in the topology."""
    from sdkit_migraphx import backend

    fake = FakeMigraphx()
    monkeypatch.setitem(sys.modules, "migraphx", fake)
    monkeypatch.setattr(backend, "amd_gpus", lambda: [Device("rocm", 0, "gfx1100")])
    return fake
