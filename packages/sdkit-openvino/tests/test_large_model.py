"""A model whose weights exceed protobuf's 2 GiB limit compiles from memory (slow: 2.2 GB).

Two 1.1 GB tables rather than one 2.2 GB one: OpenVINO 2026.4's CPU Gather crashes reading a
single constant past a 2 GiB offset (a kernel limit, unrelated to how sdkit hands weights over).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.model import Graph, Model, WeightSet


def gather_model(tables: dict[str, np.ndarray]) -> Model:
    """One Gather per table, built weightless: no table ever enters a protobuf."""
    metas, nodes, outputs = [], [], []
    for name, table in tables.items():
        meta = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(table.shape))
        meta.data_location = TensorProto.EXTERNAL
        entry = meta.external_data.add()
        entry.key, entry.value = "location", "sdkit:weightset"
        metas.append(meta)
        nodes.append(helper.make_node("Gather", [name, "i"], [f"{name}_out"]))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [3]))
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, [3])]
    graph = helper.make_graph(nodes, "big_gather", inputs, outputs, metas)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return Model(Graph(proto), WeightSet(tables))


@pytest.mark.slow
def test_weights_over_2_gib(sdkit_isolated: Path) -> None:
    count = 1_100_000_000 // 4
    tables = {"a": np.arange(count, dtype=np.float32), "b": -np.arange(count, dtype=np.float32)}
    model = gather_model(tables)
    assert model.weights.nbytes > 2**31
    compiled = sdkit.compile(model, backend="openvino", cache=False)
    picks = np.array([count - 1, 0, 16_777_215], dtype=np.int64)
    out = compiled.run({"i": picks})
    np.testing.assert_array_equal(out["a_out"], tables["a"][picks])
    np.testing.assert_array_equal(out["b_out"], tables["b"][picks])
