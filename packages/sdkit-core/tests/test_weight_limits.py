"""Weights against the memory budget (issue 30, item 7): an ONNX model whose external weight is
larger than the budget, or than the process may map (``ulimit -v``), is one clear error on every
backend before a backend maps or copies it, never a segfault, an OOM kill or an exit 0. The
weights are sparse files: they cost no disk, and nothing here reads them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit import limits
from sdkit.errors import ResourceLimitError

BACKENDS = {"reference": "onnx", "ggml": "sdkit_ggml", "openvino": "openvino"}


def _sparse_model(folder: Path, nbytes: int, length: int | None = None) -> Path:
    """``y = x + w[:4]`` with ``w`` a float32 external weight of ``nbytes`` in a sparse file
    (``length``: the byte count the model claims, when it is not the weight's own)."""
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[nbytes // 4])
    weight.data_location = TensorProto.EXTERNAL
    declared = nbytes if length is None else length
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(declared))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    with (folder / "w.bin").open("wb") as f:
        f.truncate(max(nbytes, declared))
    nodes = [helper.make_node("Slice", ["w", "begin", "end"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            weight,
            helper.make_tensor("begin", TensorProto.INT64, [1], [0]),
            helper.make_tensor("end", TensorProto.INT64, [1], [4]),
        ],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _installed(backend: str) -> None:
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"{backend} is not installed")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("isolate", [False, True])
def test_weights_over_the_budget_are_refused_before_a_backend_sees_them(
    backend: str, isolate: bool, tmp_path: Path
) -> None:
    _installed(backend)
    model = sdkit.load_model(_sparse_model(tmp_path, 1 << 30))  # 1 GB, never read
    limits.set_memory_budget("256M")
    try:
        with pytest.raises(ResourceLimitError, match=r"loading the model's 3 weight tensors needs 1\.07 GB.*268 MB"):
            sdkit.compile(model, backend=backend, isolate=isolate)
    finally:
        limits.set_memory_budget(None)


def test_an_external_tensor_read_into_memory_is_checked_first(tmp_path: Path) -> None:
    # a byte length that does not match the shape: not mapped, onnx would read all of it
    path = _sparse_model(tmp_path, 16, length=256 << 20)
    limits.set_memory_budget("64M")
    try:
        with pytest.raises(ResourceLimitError, match=r"external tensor 'w' \(read into memory\) needs 268 MB"):
            sdkit.load_model(path)
    finally:
        limits.set_memory_budget(None)


_UNDER_ULIMIT = """
import resource, sys
import sdkit
from sdkit.errors import SdkitError
model = sdkit.load_model(sys.argv[1])
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))  # 1 GB more
try:
    sdkit.compile(model, backend=sys.argv[2], threads=1).run({"x": __import__("numpy").zeros(4, "float32")})
except SdkitError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
"""


@pytest.mark.parametrize("backend", ["ggml", "openvino"])
def test_a_weight_that_cannot_be_mapped_is_a_clear_error(backend: str, tmp_path: Path) -> None:
    """Under ``ulimit -v`` (1 GB more than the process has), an 8 GB weight that fits the budget
    cannot be memory-mapped: a ResourceLimitError saying so (was ``internal error: OSError``)."""
    _installed(backend)
    path = _sparse_model(tmp_path, 8 << 30)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_UNDER_ULIMIT), str(path), backend],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "SDKIT_MEMORY_BUDGET": "1T"},  # the budget lets it through
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout.startswith("ResourceLimitError external weight w.bin (8.59 GB at offset 0) is more than"), (
        done.stdout
    )
    assert "ulimit -v" in done.stdout


def test_the_budget_is_at_most_the_address_space_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    unlimited = limits.machine_memory()
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 30, resource.RLIM_INFINITY))
    assert limits.machine_memory() == min(unlimited, 1 << 30)
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert limits.machine_memory() == unlimited
    assert np.iinfo(np.int64).max > unlimited > 0
