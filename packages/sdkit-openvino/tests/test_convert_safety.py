"""What the converter refuses or now accepts (issue 15, findings 2 and 4).

A sparse Constant whose values sit at ``*/_ORT_MEM_ADDR_/*`` made OpenVINO read this process's
memory at the address in ``offset`` (SIGSEGV at 4096). Core refuses such models when loading;
the converter refuses them too in a Graph built without sdkit's loader, since its own in-memory
references use that very location. Run in a child process: a regression would crash it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.model import Model
from sdkit.testing import compare_with_reference

_SPARSE_AT_AN_ADDRESS = """
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from sdkit.device import CPU
from sdkit.errors import SdkitError
from sdkit.model import Graph, WeightSet
from sdkit.options import Options
from sdkit_openvino.backend import OpenVinoBackend

values = TensorProto(name="v", data_type=TensorProto.FLOAT, dims=[2])
values.data_location = TensorProto.EXTERNAL
for key, value in (("location", "*/_ORT_MEM_ADDR_/*"), ("offset", "4096"), ("length", "8")):
    entry = values.external_data.add()
    entry.key, entry.value = key, value
sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 3], np.int64), "i"), [4])
{where}
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], sparse_initializer=inits)
proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
try:
    compiled = OpenVinoBackend().compile(Graph(proto), WeightSet(), CPU, Options(threads=1))
    print("RAN", compiled.run({{"x": np.zeros(4, np.float32)}}))
except SdkitError as exc:
    print(type(exc).__name__, exc)
"""
_WHERE = {
    "sparse Constant": 'nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse), '
    'helper.make_node("Add", ["x", "c"], ["y"])]; inits = []',
    "sparse initializer": 'nodes = [helper.make_node("Add", ["x", "v"], ["y"])]; inits = [sparse]',
}


def test_memory_address_in_a_graph_is_refused_by_the_converter() -> None:
    for where, code in _WHERE.items():
        script = _SPARSE_AT_AN_ADDRESS.format(where=textwrap.dedent(code))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{where}: child died with {done.returncode}: {done.stderr[-1500:]}"
        assert done.stdout.startswith("ModelFormatError"), (where, done.stdout)
        assert "_ORT_MEM_ADDR_" in done.stdout


def test_scalar_initializers_convert() -> None:
    """A 0-d initializer was refused: ``weight 's' is float32[1], the model expects float32[]``."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])],
        "scalar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(np.array(2.5, np.float32), "s"),
            numpy_helper.from_array(np.array(7, np.int64), "i"),
            numpy_helper.from_array(np.full((), -1.0, np.float32), "t"),
        ],
    )
    model = Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert model.weights["s"].shape == ()
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    out = sdkit.compile(model, backend="openvino").run(feeds)
    assert max(compare_with_reference(out, model, feeds).values()) == 0.0
