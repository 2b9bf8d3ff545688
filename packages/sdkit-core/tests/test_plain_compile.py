"""A plain ``sdkit.compile`` does not load the tuning code: with an explicit backend, and with
``auto`` where no tune stored timings, ``sdkit.tuned``, ``sdkit.tuning`` and ``sdkit.trials``
stay unimported (checked in a fresh interpreter, where nothing else imported them first). Once a
tune stored timings, ``auto`` consults them (``test_tuning.py`` checks what it then chooses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TUNING_MODULES = ["sdkit.trials", "sdkit.tuned", "sdkit.tuning"]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnx
    from onnx import helper
    import sdkit

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    model = sdkit.Model.from_proto(proto)
    feeds = {"x": np.array([[-1, 0, 1], [2, -2, 3]], np.float32)}
    compiled = sdkit.compile(model, backend=sys.argv[1])
    out = compiled.run(feeds)["y"]
    assert np.array_equal(out, np.maximum(feeds["x"], 0)), out
    print(json.dumps({"backend": compiled.backend_name, "loaded": sorted(m for m in sys.modules if m in MODULES)}))
    """
)


def _compile_in_fresh_interpreter(backend: str, cache: Path, **env: str) -> dict[str, object]:
    script = f"MODULES = {TUNING_MODULES!r}\n" + SCRIPT
    environ = {**os.environ, "SDKIT_CACHE_DIR": str(cache), **env}
    environ.pop("SDKIT_BACKEND", None)
    run = subprocess.run(
        [sys.executable, "-c", script, backend], env=environ, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_an_explicit_backend_never_loads_the_tuning_code(tmp_path: Path) -> None:
    result = _compile_in_fresh_interpreter("reference", tmp_path)
    assert result == {"backend": "reference", "loaded": []}


@pytest.mark.parametrize("stored", [False, True])
def test_auto_loads_the_tuning_code_only_once_timings_are_stored(tmp_path: Path, stored: bool) -> None:
    if stored:  # what a tune leaves behind: a timings folder (here without a record for this graph)
        (tmp_path / "timings").mkdir()
    # the reference backend alone, so auto's choice is the same with or without plugins installed
    disable = "ggml,openvino,trt,migraphx,coreml"
    result = _compile_in_fresh_interpreter("auto", tmp_path, SDKIT_DISABLE_PLUGINS=disable)
    assert result["loaded"] == (TUNING_MODULES if stored else [])
