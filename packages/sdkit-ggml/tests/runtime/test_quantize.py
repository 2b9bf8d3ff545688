"""runtime/quantize.py: ggml_quantize_chunk's Q8_0 blocks against the format written out in
numpy (ggml-common.h's block_q8_0: an F16 scale d = max|w| / 127, then 32 int8 round(w / d))."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.errors import InputError
from sdkit_ggml.runtime import lib as L
from sdkit_ggml.runtime.quantize import quantizable, quantize
from sdkit_ggml.runtime.tensors import tensor_bytes


def numpy_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = w.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    return d.astype(np.float16), np.round(blocks * inverse[:, None]).astype(np.int8)


def test_blocks_match_the_format() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 96), dtype=np.float32)
    w[2, :32] = 0  # an all-zero block: scale 0, no division by zero
    raw = quantize(L.load_library(), w, L.GGML_TYPE_Q8_0, "w")
    assert raw.nbytes == tensor_bytes(w.shape, L.GGML_TYPE_Q8_0) == 6 * 3 * 34
    blocks = raw.reshape(-1, 34)
    d, q = blocks[:, :2].copy().view(np.float16).ravel(), blocks[:, 2:].copy().view(np.int8)
    want_d, want_q = numpy_q8_0(w)
    np.testing.assert_array_equal(d, want_d)
    # ggml rounds half away from zero, numpy to even: a tie may differ by one step
    assert np.abs(q.astype(np.int16) - want_q).max() <= 1
    assert np.mean(q == want_q) > 0.999
    # each weight decodes to within half a step, plus the F16 rounding of the scale (relative
    # 2^-11, times |q| <= 127)
    decoded = (q.astype(np.float32) * d.astype(np.float32)[:, None]).reshape(w.shape)
    step = np.repeat(d.astype(np.float32), 32).reshape(w.shape)
    assert np.all(np.abs(decoded - w) <= step * (0.5 + 127 * 2.0**-11) + 1e-7)


def test_only_whole_blocks_are_quantized() -> None:
    assert quantizable((8, 64), L.GGML_TYPE_Q8_0)
    assert not quantizable((8, 40), L.GGML_TYPE_Q8_0)
    assert not quantizable((64,), L.GGML_TYPE_Q8_0)  # vectors stay F16, as in stable-diffusion.cpp
    with pytest.raises(InputError):
        quantize(L.load_library(), np.zeros((2, 40), np.float32), L.GGML_TYPE_Q8_0, "w")
