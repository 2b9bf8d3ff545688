"""The bad-input matrix of issue 15: every class of bad input, through every backend installed
here, each backend in its own process (so an abort or a segfault is seen, not suffered). Each
case must end as a clear error (an ``SdkitError``) or, for valid-but-unusual inputs, as output
that equals onnx.reference (NaN where it has NaN). Prints a table; exit 1 on any other result.

    python tools/bad_inputs.py                 # reference, ggml, openvino where installed
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
MEMORY = "*/_ORT_MEM_ADDR_/*"


def _model(
    nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = (), opset: int = 17, **kw: Any
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "case", inputs, outputs, list(inits), **kw)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, dims: Any, elem: int = F) -> Any:
    return helper.make_tensor_value_info(name, elem, dims)


def _external(name: str, location: str) -> TensorProto:
    tensor = TensorProto(name=name, data_type=F, dims=[2])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "4096"), ("length", "8")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _relu(dims: Any) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", dims)], [_vi("y", dims)])


def _binary(op: str, n: int) -> onnx.ModelProto:
    return _model([helper.make_node(op, ["a", "b"], ["y"])], [_vi("a", [n]), _vi("b", [n])], [_vi("y", [n])])


_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 3.4e38, -3.4e38], np.float32)
_A, _B = np.repeat(_SPECIAL, 9), np.tile(_SPECIAL, 9)


def _gather() -> onnx.ModelProto:
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "t")
    return _model(
        [helper.make_node("Gather", ["t", "i"], ["y"])], [_vi("i", [3], TensorProto.INT64)], [_vi("y", [3, 4])], [table]
    )


def _scalar_init() -> onnx.ModelProto:
    s = numpy_helper.from_array(np.array(2.5, np.float32), "s")
    return _model([helper.make_node("Mul", ["x", "s"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], [s])


def _expand(shape: list[int]) -> onnx.ModelProto:
    s = numpy_helper.from_array(np.array(shape, np.int64), "s")
    return _model([helper.make_node("Expand", ["x", "s"], ["y"])], [_vi("x", [1])], [_vi("y", None)], [s])


def _sparse_constant(location: str) -> onnx.ModelProto:
    sparse = helper.make_sparse_tensor(_external("v", location), numpy_helper.from_array(np.array([0, 3]), "i"), [4])
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse), helper.make_node("Add", ["x", "c"], ["y"])]
    return _model(nodes, [_vi("x", [4])], [_vi("y", [4])])


def _dense_external(location: str) -> onnx.ModelProto:
    return _model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], [_external("w", location)]
    )


HUGE = 1 << 40  # a 1 TB sparse file (no disk): over any machine's memory budget


def _huge_weight(length: int | None = None) -> onnx.ModelProto:
    """``y = x + w[:2]``, ``w`` a 1 TB float32 external weight in a sparse file (``length``: what
    the model claims instead, which makes it one read into memory, not mapped)."""
    weight = TensorProto(name="w", data_type=F, dims=[HUGE // 4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "huge.bin"), ("offset", "0"), ("length", str(length or HUGE))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("Slice", ["w", "s", "e"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])]
    ends = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 0), ("e", 2))]
    return _model(nodes, [_vi("x", [2])], [_vi("y", [2])], [weight, *ends])


def _conv_group(group: int) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group)
    return _model([node], [_vi("x", [1, 2, 4, 4])], [_vi("y", [1, 2, 4, 4])], [w])


def _nested_if(depth: int) -> onnx.ModelProto:
    """``y = x`` through ``depth`` If nodes, each in the one above's branches."""
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "leaf", [], [_vi("y", [2])])
    for level in range(depth):
        node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
        if level == depth - 1:
            return _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", [2])])
        body = helper.make_graph([node], f"level{level}", [], [_vi("y", [2])])
    return _relu([2])


def _z(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


# class -> [(case name, model, feeds, input_shapes, expect: "error" | "correct")]
Case = tuple[str, Callable[[], onnx.ModelProto], dict[str, np.ndarray], dict[str, list[int]] | None, str]
CASES: dict[str, list[Case]] = {
    "opset newer than onnx": [
        (
            f"opset {v}",
            lambda v=v: _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=v),
            {"x": _z(2)},
            None,
            "error",
        )
        for v in (30, 99, 2**31 - 1)
    ],
    "huge declared or requested dims": [
        ("input 1x4x200000x200000", lambda: _relu([1, 4, 200000, 200000]), {"x": _z((1, 4, 2, 2))}, None, "error"),
        ("Expand to 1x4x2^30x2^30", lambda: _expand([1, 4, 2**30, 2**30]), {"x": _z(1)}, None, "error"),
        ("Expand to 2^17x2^17x2^17", lambda: _expand([2**17] * 3), {"x": _z(1)}, None, "error"),
        ("input_shapes 2^31x2^31", lambda: _relu(["a", "b"]), {"x": _z((1, 1))}, {"x": [2**31, 2**31]}, "error"),
        (
            "input_shapes 2^30x2^30x4",
            lambda: _relu(["a", "b", 4]),
            {"x": _z((1, 1, 4))},
            {"x": [2**30, 2**30, 4]},
            "error",
        ),
        ("input_shapes negative", lambda: _relu(["a", 4]), {"x": _z((1, 4))}, {"x": [-5, 4]}, "error"),
    ],
    "empty inputs": [
        ("latent 1x32x0x8", lambda: _relu([1, 32, "h", 8]), {"x": _z((1, 32, 0, 8))}, None, "error"),
        ("input_shapes with a 0", lambda: _relu(["n", 4]), {"x": _z((0, 4))}, {"x": [0, 4]}, "error"),
        ("batch of 0", lambda: _relu(["n", 4]), {"x": _z((0, 4))}, None, "error"),
    ],
    "special external-data locations": [
        (
            f"{kind} at {loc!r}",
            (lambda kind=kind, loc=loc: (_sparse_constant if kind == "sparse" else _dense_external)(loc)),
            {"x": _z(4 if kind == "sparse" else 2)},
            None,
            "error",
        )
        for kind in ("sparse", "dense")
        for loc in (MEMORY, "*", "/etc/passwd", "../../secret.bin")
    ],
    "weights over the memory budget": [
        ("1 TB sparse external weight", _huge_weight, {"x": _z(2)}, None, "error"),
        ("1 TB external tensor read eagerly", lambda: _huge_weight(HUGE + 4), {"x": _z(2)}, None, "error"),
    ],
    "node attributes and nesting": [
        ("Conv group=0", lambda: _conv_group(0), {"x": _z((1, 2, 4, 4))}, None, "error"),
        ("Conv group=-1", lambda: _conv_group(-1), {"x": _z((1, 2, 4, 4))}, None, "error"),
        ("If nested 14 deep", lambda: _nested_if(14), {"c": np.array(True), "x": _z(2)}, None, "error"),
    ],
    "feeds that do not fit": [
        ("wrong dtype", lambda: _relu([2, 3]), {"x": _z((2, 3), np.float64)}, None, "error"),
        ("wrong rank", lambda: _relu([2, 3]), {"x": _z((6,))}, None, "error"),
        ("wrong dim", lambda: _relu([2, 3]), {"x": _z((2, 4))}, None, "error"),
        ("missing input", lambda: _relu([2, 3]), {}, None, "error"),
        ("object array", lambda: _relu([2, 3]), {"x": np.array([[None] * 3] * 2, object)}, None, "error"),
    ],
    "out-of-range indices": [
        (f"Gather ids {bad}", _gather, {"i": np.array([0, bad, 1], np.int64)}, None, "error")
        for bad in (10, -11, 10**9, -(10**9), 2**62)
    ],
    "valid but unusual values": [
        ("Max with NaN/inf", lambda: _binary("Max", 81), {"a": _A, "b": _B}, None, "correct"),
        ("Min with NaN/inf", lambda: _binary("Min", 81), {"a": _A, "b": _B}, None, "correct"),
        ("Relu of NaN/inf", lambda: _relu([81]), {"x": _A}, None, "correct"),
        ("Gather negative ids", _gather, {"i": np.array([-1, -10, 3], np.int64)}, None, "correct"),
        ("0-d initializer", _scalar_init, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, None, "correct"),
    ],
}


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))))


def run_backend(backend: str) -> None:
    """In the child: each case, one JSON line before (so a crash names it) and one after."""
    import bad_input_files as files

    import sdkit
    from sdkit.errors import SdkitError
    from sdkit.model import Model

    folder = Path(tempfile.mkdtemp(prefix="sdkit-bad-"))
    (folder / "*").write_bytes(b"\0" * 8192)  # the file a special location needs to pass onnx's checks
    with (folder / "huge.bin").open("wb") as f:  # sparse: costs no disk
        f.truncate(HUGE + 4)
    for klass, cases in CASES.items():
        for name, make, feeds, shapes, expect in cases:
            print(json.dumps({"start": [klass, name]}), flush=True)
            try:
                path = folder / "model.onnx"
                onnx.save(make(), path)
                model = sdkit.load_model(path)
                engine, options = files.engine(backend)  # ggml-vulkan: ggml on vulkan:0
                compiled = sdkit.compile(model, backend=engine, input_shapes=shapes, **options)
                out = compiled.run(feeds)
                if expect == "error":
                    result = "exit 0 on invalid input"
                else:
                    from onnx.reference import ReferenceEvaluator

                    assert isinstance(model, Model)
                    want = ReferenceEvaluator(model.graph.to_onnx(model.weights)).run(None, feeds)
                    ok = all(_same(out[o.name], np.asarray(w)) for o, w in zip(model.outputs, want, strict=True))
                    result = "correct output" if ok else "WRONG output"
            except SdkitError:
                result = "clear error" if expect == "error" else "refused a valid input"
            except Exception as exc:
                result = f"traceback: {type(exc).__name__}: {exc}"[:200]
            print(json.dumps({"done": [klass, name, result]}), flush=True)
    run_file_cases(backend, folder)


def _file_case(case: Callable[[str, Path], None], backend: str, folder: Path) -> str:
    from sdkit.errors import SdkitError

    try:
        case(backend, folder)
    except SdkitError:
        return "clear error"
    except Exception as exc:
        return f"traceback: {type(exc).__name__}: {exc}"[:200]
    return "exit 0 on invalid input"


def run_file_cases(backend: str, folder: Path) -> None:
    """In the child: the file classes of ``bad_input_files`` (each backend runs the per-backend
    ones; ``once`` runs the rest and the server's requests)."""
    import bad_input_files as files

    for klass, (per_backend, cases) in files.FILE_CASES.items():
        if per_backend != (backend != "once"):
            continue
        for name, case in cases:
            print(json.dumps({"start": [klass, name]}), flush=True)
            scratch = Path(tempfile.mkdtemp(dir=folder))
            result = _file_case(case, "reference" if backend == "once" else backend, scratch)
            if name in files.ACCEPTED or name.startswith("control:"):
                ran = "control ran" if name.startswith("control:") else "documented result"
                result = ran if result == "exit 0 on invalid input" else f"control failed: {result}"
            print(json.dumps({"done": [klass, name, result]}), flush=True)
    if backend != "once":
        return
    with files.serve_client(Path(tempfile.mkdtemp(dir=folder))) as client:
        for name, method, url, body in files.SERVER_CASES:
            print(json.dumps({"start": [files.SERVER_CLASS, name]}), flush=True)
            try:
                reply = getattr(client, method)(url, json=body)
                result = files.judge_reply(name, reply.status_code, reply.text)
            except Exception as exc:
                result = f"traceback: {type(exc).__name__}: {exc}"[:200]
            print(json.dumps({"done": [files.SERVER_CLASS, name, result]}), flush=True)


def _vulkan_dir() -> Path | None:
    """ggml's Vulkan build: $SDKIT_GGML_VULKAN_DIR, else the one ``native_build --vulkan`` made
    in sdkit's cache (``~/.cache/sdkit/ggml-vulkan/<version>``)."""
    import os

    named = os.environ.get("SDKIT_GGML_VULKAN_DIR")
    if named:
        return Path(named)
    found = sorted((Path.home() / ".cache" / "sdkit" / "ggml-vulkan").glob("*/libggml-vulkan.*"))
    return found[-1].parent if found else None


def _run_child(backend: str, table: dict[tuple[str, str], Counter[str]], bad: list[tuple[str, ...]]) -> None:
    """One child process; its JSON lines into ``table`` and ``bad`` (a death names its case)."""
    import os

    done = subprocess.run(
        [sys.executable, __file__, "--child", backend],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GGML_NO_BACKTRACE": "1", **_child_env(backend)},
    )
    started, finished = [], set()
    for line in done.stdout.splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if "start" in record:
            started.append(tuple(record["start"]))
        elif "done" in record:
            klass, name, result = record["done"]
            finished.add((klass, name))
            table.setdefault((klass, backend), Counter())[result] += 1
            if result not in ("clear error", "correct output", "clear 4xx", "documented result", "control ran"):
                bad.append((backend, klass, name, result))
    if done.returncode != 0:
        crashed = next((s for s in started if s not in finished), ("?", "?"))
        table.setdefault((crashed[0], backend), Counter())[f"CRASH (exit {done.returncode})"] += 1
        bad.append((backend, crashed[0], crashed[1], f"process died: {done.returncode}: {done.stderr[-300:]}"))


def _child_env(backend: str) -> dict[str, str]:
    if backend != "ggml-vulkan":
        return {}
    # a software Vulkan device (llvmpipe) is CPU-typed: ggml lists it only when named
    return {"SDKIT_GGML_LIB_DIR": str(_vulkan_dir()), "GGML_VK_VISIBLE_DEVICES": "0"}


def _cells(table: dict[tuple[str, str], Counter[str]], klass: str, columns: list[str]) -> str:
    return " | ".join(
        ", ".join(f"{n} {r}" for r, n in sorted(table.get((klass, b), Counter()).items())) or "-" for b in columns
    )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        if sys.argv[2] == "once":
            run_file_cases("once", Path(tempfile.mkdtemp(prefix="sdkit-bad-")))
        else:
            run_backend(sys.argv[2])
        return 0
    import importlib.util

    import bad_input_files as files

    backends = [
        b
        for b, m in (
            ("reference", "onnx"),
            ("ggml", "sdkit_ggml"),
            ("ggml-vulkan", "sdkit_ggml"),
            ("openvino", "openvino"),
        )
        if importlib.util.find_spec(m)
        and (b != "ggml-vulkan" or _vulkan_dir() is not None)
        and (len(sys.argv) == 1 or b in sys.argv[1:])
    ]
    children = [*backends, "once"] if len(sys.argv) == 1 or "once" in sys.argv[1:] else backends
    table: dict[tuple[str, str], Counter[str]] = {}
    bad: list[tuple[str, ...]] = []
    for child in children:
        _run_child(child, table, bad)
    print("| bad-input class | cases | " + " | ".join(backends) + " |")
    print("| --- | ---: | " + " | ".join("---" for _ in backends) + " |")
    for klass, cases in CASES.items():
        print(f"| {klass} | {len(cases)} | {_cells(table, klass, backends)} |")
    total = sum(len(c) for c in CASES.values()) * len(backends)
    print("\n| files and requests | cases | " + " | ".join(backends) + " | once |")
    print("| --- | ---: | " + " | ".join("---" for _ in backends) + " | --- |")
    for klass, (per_backend, file_cases) in files.FILE_CASES.items():
        print(f"| {klass} | {len(file_cases)} | {_cells(table, klass, [*backends, 'once'])} |")
        total += len(file_cases) * (len(backends) if per_backend else 1)
    server = _cells(table, files.SERVER_CLASS, [*backends, "once"])
    print(f"| {files.SERVER_CLASS} | {len(files.SERVER_CASES)} | {server} |")
    total += len(files.SERVER_CASES)
    print(f"\n{total} case runs on {len(backends)} backends; {len(bad)} not a clear error or correct output")
    for item in bad:
        print("  ", *item)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
