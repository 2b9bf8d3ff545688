"""GGUF files for tests, written by llama.cpp's ``gguf`` package (an independent writer: the oracle
of sdkit's GGUF header reader; a test tool, dev.py's TEST_TOOLS). The test is skipped where the
package is not installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def write_gguf(
    path: Path, tensors: dict[str, tuple[tuple[int, ...], str]], metadata: dict[str, str] | None = None
) -> Path:
    """A GGUF file with ``name -> (shape, type)`` tensors (``f32``, ``f16``, ``q8_0``, ``q4_0``,
    ``q4_K``...) of seeded random values, written by the ``gguf`` package."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch="sdkit-test")
    for key, value in (metadata or {}).items():
        writer.add_string(key, value)
    rng = np.random.default_rng(0)
    for name, (shape, kind) in tensors.items():
        values = rng.standard_normal(shape).astype(np.float32)
        quant = getattr(gguf.GGMLQuantizationType, kind.upper())
        if kind in ("f32", "f16"):
            writer.add_tensor(name, values.astype(np.float16 if kind == "f16" else np.float32))
        else:
            try:
                data = gguf.quants.quantize(values, quant)
            except NotImplementedError:  # the package quantizes some types only: zero blocks
                data = np.zeros(gguf.quant_shape_to_byte_shape(shape, quant), np.uint8)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
