"""Real SD architectures (seeded random weights) vs onnxruntime."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest

import sdkit
from sdkit.model import Model


def _compare(sd_graphs: ModuleType, name: str) -> float:
    proto = sd_graphs.load_model(name, seed=0)
    feeds = sd_graphs.example_inputs(name)
    compiled = sdkit.compile(Model.from_proto(proto), backend="openvino", threads=2)
    ours = compiled.run(feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    worst = 0.0
    for info, expected in zip(compiled.outputs, session.run(None, feeds), strict=True):
        got = ours[info.name].astype(np.float64)
        want = expected.astype(np.float64)
        worst = max(worst, float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    return worst


@pytest.mark.parametrize("name", ["tiny_clip_text", "tiny_unet"])
def test_tiny_graphs_match_onnxruntime(sd_graphs: ModuleType, sdkit_isolated: Path, name: str) -> None:
    assert _compare(sd_graphs, name) <= 1e-5


@pytest.mark.slow
def test_sd15_vae_decoder_matches_onnxruntime(sd_graphs: ModuleType, sdkit_isolated: Path) -> None:
    """1x4x32x32 latent -> 256x256 image, relative L2 against onnxruntime."""
    assert _compare(sd_graphs, "sd15_vae_decoder") <= 1e-5
