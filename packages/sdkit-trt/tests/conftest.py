"""Shared helpers: the TAEF2 model files and onnxruntime sessions for oracle runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parents[3]


def taef2_dir() -> Path | None:
    """``<repo>/models/taef2`` or the shared copy beside the repository; None if neither."""
    for folder in (REPO / "models" / "taef2", REPO.parent / "shared" / "models" / "taef2"):
        if (folder / "taef2_decoder.onnx").is_file():
            return folder
    return None


@pytest.fixture
def taef2() -> Path:
    folder = taef2_dir()
    if folder is None:
        pytest.skip("TAEF2 model files not found (models/taef2 or ../shared/models/taef2)")
    return folder


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a complete ModelProto on onnxruntime's CPU provider (2 threads)."""
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.ir_version = min(model.ir_version, 10)  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 writes 14
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(r) for r in session.run(None, feeds)]
