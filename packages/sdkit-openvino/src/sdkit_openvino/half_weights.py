"""fp16/bf16 MatMul weights kept in their dtype in the compiled model.

A checkpoint stored in fp16 or bf16 and computed in f32 reaches OpenVINO as ``Constant(f16 or
bf16) -> Convert(f32) -> MatMul``. The CPU plugin folds such a Convert into an f32 constant and
then keeps a transposed f32 copy for its FullyConnected kernel: two f32 copies, four times the
stored weights. It keeps the weights in their own dtype (the Constant and its transposed copy,
widened inside the kernel, which computes in f32) only when the Convert is marked as a
*decompression*: the mark ``compress_model_transformation`` (``ov.save_model(compress_to_fp16=
True)``) puts on the Converts it makes, and which cannot be made from Python. So a marked
Convert is taken from that transformation run on a one-element model, pointed at the weight's
own Constant, and put in place of the original Convert: same values, same f32 computation.
Measured on the reduced-depth Flux transformer: see the package README.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HALF_TYPES = ("f16", "bf16")


def _type_name(output: Any) -> str:
    return str(output.get_element_type().get_type_name())


def _candidates(model: Any) -> list[Any]:
    """Converts from an f16/bf16 Constant to f32 read only by MatMuls (the plugin's
    FullyConnected takes compressed weights; other consumers would fold them anyway)."""
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Convert" or _type_name(op.output(0)) != "f32":
            continue
        source = op.input_value(0).get_node()
        if source.get_type_name() != "Constant" or _type_name(source.output(0)) not in HALF_TYPES:
            continue
        readers = [target.get_node().get_type_name() for target in op.output(0).get_target_inputs()]
        if readers and all(reader == "MatMul" for reader in readers):
            found.append(op)
    return found


def _marked_convert() -> Any:
    """A fresh Convert(f16 -> f32) carrying OpenVINO's decompression mark."""
    from openvino import Model
    from openvino import opset13 as ops
    from openvino._offline_transformations import compress_model_transformation

    single = Model([ops.result(ops.constant(np.ones((1,), dtype=np.float32)))], [], "weight")
    compress_model_transformation(single)
    return single.get_results()[0].input_value(0).get_node()


def keep_half_weights(model: Any) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many weights now
    stay in their dtype."""
    kept = 0
    for convert in _candidates(model):
        try:
            marked = _marked_convert()
        except (ImportError, RuntimeError):  # a private module: gone or changed, fold to f32 as before
            return kept
        if marked.get_type_name() != "Convert":  # this OpenVINO did not compress: nothing to take
            return kept
        marked.input(0).replace_source_output(convert.input_value(0))
        marked.validate_and_infer_types()
        convert.output(0).replace(marked.output(0))
        kept += 1
    return kept
