"""Isolation (issue 15): with ``isolate=True`` (or ``SDKIT_ISOLATE=1``) a real ``GGML_ASSERT``
abort in a backend's compile or first run kills a child process, not this one, and comes back
as one ``BackendCrashedError`` naming the backend and the signal. The crash is real: the same
plugin without isolation kills its process with SIGABRT (the last test)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.errors import BackendCrashedError, OptionError, UnsupportedModelError
from sdkit.model import Model
from sdkit.plugins import reset_plugins

PLUGIN = Path(__file__).parent / "isolation_plugin"


def _relu() -> Model:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.fixture
def crashing_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.delenv("SDKIT_ISOLATE", raising=False)
    reset_plugins()
    yield
    monkeypatch.undo()
    reset_plugins()


def test_an_abort_at_compile_is_one_error(crashing_plugin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH_WHEN", "compile")
    with pytest.raises(BackendCrashedError, match=r"'crashing-ggml' crashed during compile \(SIGABRT\).*GGML_ASSERT"):
        sdkit.compile(_relu(), backend="crashing-ggml", isolate=True, threads=1)


def test_an_abort_at_a_first_run_is_one_error_and_the_model_lives_on(
    crashing_plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH_WHEN", "run")
    monkeypatch.setenv("SDKIT_ISOLATE", "1")  # the environment's switch
    compiled = sdkit.compile(_relu(), backend="crashing-ggml", threads=1)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(BackendCrashedError, match=r"during its first run \(SIGABRT\)"):
        compiled.run({"x": np.zeros((3, 4), np.float32)})
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))  # this process lives on


def test_isolate_option_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OptionError, match="isolate must be true or false"):
        sdkit.compile(_relu(), backend="ggml", isolate="yes")
    monkeypatch.setenv("SDKIT_ISOLATE", "maybe")
    with pytest.raises(OptionError, match="SDKIT_ISOLATE must be 1 or 0"):
        sdkit.compile(_relu(), backend="ggml")


def test_without_isolation_the_same_crash_kills_the_process() -> None:
    script = (
        "import numpy as np, sdkit, test_isolation as t\n"
        "sdkit.compile(t._relu(), backend='crashing-ggml', threads=1).run({'x': np.zeros((3, 4), np.float32)})\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLUGIN), str(Path(__file__).parent)]),
        "CRASH_WHEN": "run",
        "GGML_NO_BACKTRACE": "1",
    }
    env.pop("SDKIT_ISOLATE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -6, (done.returncode, done.stderr[-500:])  # SIGABRT
    assert "GGML_ASSERT" in done.stderr


def test_a_python_error_in_the_child_is_the_same_error_here() -> None:
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(UnsupportedModelError) as isolated:
        sdkit.compile(model, backend="ggml", isolate=True, threads=1)
    with pytest.raises(UnsupportedModelError) as direct:
        sdkit.compile(model, backend="ggml", threads=1)
    assert str(isolated.value) == str(direct.value)
