"""Write the fuzz seed corpus (packages/sdkit-core/tests/data/fuzz/<target>/): small valid
inputs of each reader, from which the fuzzers mutate. Re-run to regenerate; deterministic."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "packages" / "sdkit-core" / "tests" / "data" / "fuzz"
TINY = ROOT / "fixtures" / "tiny_pipeline" / "model"


def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "seed", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def onnx_seeds() -> dict[str, bytes]:
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, ["n", 4])
    y = helper.make_tensor_value_info("y", f, None)
    rng = np.random.default_rng(0)
    return {
        "relu.onnx": _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], []),
        "expand.onnx": _model(
            [helper.make_node("Expand", ["x", "s"], ["y"])],
            [x],
            [y],
            [numpy_helper.from_array(np.array([2, 3, 4]), "s")],
        ),
        "conv.onnx": _model(
            [helper.make_node("Conv", ["i", "w"], ["y"], pads=[1, 1, 1, 1])],
            [helper.make_tensor_value_info("i", f, [1, 2, 5, 5])],
            [y],
            [numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")],
        ),
        "constant_if.onnx": _model(
            [
                helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "c")),
                helper.make_node(
                    "If",
                    ["c"],
                    ["y"],
                    then_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [y_of("t")]),
                    else_branch=helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [y_of("e")]),
                ),
            ],
            [x],
            [y],
            [],
        ),
        "text_encoder.onnx": (TINY / "text_encoder" / "model.onnx").read_bytes(),
    }


def y_of(name: str):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", 4])


def safetensors_seeds() -> dict[str, bytes]:
    from safetensors.numpy import save

    return {
        "two.safetensors": save({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float16)}),
        "meta.safetensors": save({"i": np.arange(4, dtype=np.int64)}, metadata={"format": "pt"}),
        "empty.safetensors": save({"z": np.zeros((0, 3), np.float32)}),
    }


def npy_seeds() -> dict[str, bytes]:
    def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
        buffer = io.BytesIO()
        if version is None:
            np.save(buffer, array)
        else:
            np.lib.format.write_array(buffer, array, version=version)
        return buffer.getvalue()

    return {
        "latent.npy": npy(np.zeros((1, 4, 8, 8), np.float32)),
        "ids.npy": npy(np.arange(77, dtype=np.int64)[None]),
        "fortran.npy": npy(np.asfortranarray(np.ones((3, 5), np.float16))),
        "v2.npy": npy(np.ones(3, np.float64), version=(2, 0)),
        "scalar.npy": npy(np.array(1.5, np.float32)),
    }


def prompt_seeds() -> dict[str, bytes]:
    return {
        "plain.txt": b"a photo of a cat",
        "weights.txt": b"(masterpiece:1.2), [blurry], ((detailed)) BREAK a castle\\(x\\)",
        "unicode.txt": "caf\u00e9 \U0001f431 \u0000 \u200b \ud7ff".encode(errors="replace"),
        "long.txt": b"word " * 200,
    }


def tokenizer_seeds() -> dict[str, bytes]:
    folder = TINY / "tokenizer"
    return {
        "vocab.bin": b"\x00" + (folder / "vocab.json").read_bytes(),
        "config.bin": b"\x80" + (folder / "tokenizer_config.json").read_bytes(),
    }


def pipeline_seeds() -> dict[str, bytes]:
    from sdkit.testing.fuzz import _PIPELINE_FILES

    return {f"{i}.bin": bytes([i]) + (TINY / name).read_bytes() for i, name in enumerate(_PIPELINE_FILES)}


def main() -> None:
    seeds = {
        "onnx": onnx_seeds(),
        "safetensors": safetensors_seeds(),
        "npy": npy_seeds(),
        "prompt": prompt_seeds(),
        "tokenizer": tokenizer_seeds(),
        "pipeline": pipeline_seeds(),
    }
    for target, files in seeds.items():
        folder = OUT / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        print(f"{target}: {len(files)} seeds, {sum(map(len, files.values()))} bytes")
    (OUT / "README.md").write_text(json.dumps({"made_by": "tools/make_fuzz_corpus.py"}) + "\n")


if __name__ == "__main__":
    main()
