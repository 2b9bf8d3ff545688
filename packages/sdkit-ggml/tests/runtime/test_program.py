"""runtime/program.py: storage conversions at the runtime boundary."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.program import from_storage, to_storage
from sdkit_ggml.runtime.tensors import Tensor, ne_of, storage_type


def test_storage_of_each_onnx_dtype() -> None:
    assert storage_type(np.dtype(np.float16)) == L.GGML_TYPE_F32  # computed in F32
    assert storage_type(np.dtype(np.bool_)) == L.GGML_TYPE_F32  # 0/1
    assert storage_type(np.dtype(np.int64)) == L.GGML_TYPE_I32
    assert storage_type(np.dtype(np.float64)) is None


def test_ne_is_the_reversed_shape_with_leading_dims_merged() -> None:
    assert ne_of((2, 3)) == (3, 2, 1, 1)
    assert ne_of((2, 3, 4, 5, 6)) == (6, 5, 4, 6)


def test_to_storage_checks_range_and_size() -> None:
    ints = Tensor(1, (2,), np.dtype(np.int64), L.GGML_TYPE_I32)
    np.testing.assert_array_equal(to_storage(np.array([1, -2]), ints, "x"), np.array([1, -2], np.int32))
    with pytest.raises(InputError, match="int32 range"):
        to_storage(np.array([2**40, 0]), ints, "x")
    with pytest.raises(InputError, match="3 elements, expected 2"):
        to_storage(np.array([1, 2, 3]), ints, "x")


def test_from_storage_restores_the_onnx_dtype() -> None:
    assert from_storage(np.array([0.0, 1.0], np.float32), np.dtype(np.bool_)).tolist() == [False, True]
    assert from_storage(np.array([3], np.int32), np.dtype(np.int64)).dtype == np.int64


def test_a_node_the_device_cannot_compute_is_refused_before_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU backend may lack an op the CPU has; computing it would abort inside ggml, so every
    node is asked first (``ggml_backend_supports_op``) and the refusal names the op."""
    import sdkit
    from sdkit.errors import UnsupportedModelError
    from sdkit.testing import one_node_model

    lib = L.load_library()
    real = lib.functions["ggml_backend_supports_op"]

    def no_mul_mat(backend: int, node: int) -> bool:
        return (lib.ggml_op_desc(node) or b"").decode() != "MUL_MAT" and bool(real(backend, node))

    monkeypatch.setitem(lib.functions, "ggml_backend_supports_op", no_mul_mat)
    rng = np.random.default_rng(0)
    model = one_node_model("MatMul", {"a": rng.standard_normal((2, 3), dtype=np.float32)},
                           initializers={"b": rng.standard_normal((3, 4), dtype=np.float32)})  # fmt: skip
    with pytest.raises(UnsupportedModelError, match=r"CPU backend cannot compute MUL_MAT \(1 node"):
        sdkit.compile(model, backend="ggml", device="cpu").run({"a": np.ones((2, 3), np.float32)})
    monkeypatch.undo()
    relu = one_node_model("Relu", {"x": np.array([-1.0, 2.0], np.float32)})
    out = sdkit.compile(relu, backend="ggml", device="cpu").run({"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), [0.0, 2.0])
