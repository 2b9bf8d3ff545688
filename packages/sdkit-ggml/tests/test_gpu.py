"""The SD graphs and TAEF2 on ggml's GPU devices (marked ``gpu``; skipped without one).

Run where ggml is built with CUDA (``SDKIT_GGML_LIB_DIR``): ``pytest -m gpu``. Tolerances are
the GPU's, not the CPU's: ggml-cuda computes F32 matrix products in TF32 (10-bit mantissa
inputs, F32 accumulation), measured on an H100 (2026-11-27) at relative L2 4e-4 to 2.0e-3 against
onnxruntime fp32 on these graphs, TAEF2 max |diff| 1.6e-3 / 2.3e-3 on [0, 1]-scale outputs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.model import Model, load_onnx

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
REL_L2 = 5e-3  # TF32 products through a UNet / VAE: 2.5x the worst measured
MAX_ABS = 5e-3


def _gpu() -> str:
    from sdkit_ggml.backend import GgmlBackend

    found = [d for d in GgmlBackend().devices() if d.kind != "cpu"]
    if not found:
        pytest.skip("ggml lists no GPU device (build ggml with GGML_CUDA=ON and set SDKIT_GGML_LIB_DIR)")
    return str(found[0])


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize(
    "name", ["tiny_unet", "tiny_clip_text", "tiny_controlnet", "sd15_vae_encoder", "sd15_vae_decoder"]
)
def test_sd_graphs_on_the_gpu(sd_graphs: Any, name: str) -> None:
    device = _gpu()
    proto, feeds = sd_graphs.load_model(name), sd_graphs.example_inputs(name)
    model = Model.from_proto(proto)
    got = sdkit.compile(model, backend="ggml", device=device).run(feeds)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for info, ref in zip(model.outputs, want, strict=True):
        assert _rel_l2(got[info.name], ref) <= REL_L2, info.name


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_taef2_on_the_gpu_matches_the_cpu(taef2: Path, precision: str) -> None:
    device = _gpu()
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    latent = {"latent": np.random.default_rng(0).standard_normal((1, 32, 64, 64)).astype(np.float32)}
    gpu = sdkit.compile(model, backend="ggml", device=device, precision=precision).run(latent)
    cpu = sdkit.compile(model, backend="ggml", device="cpu", precision=precision).run(latent)
    name = model.outputs[0].name
    assert float(np.abs(gpu[name] - cpu[name]).max()) <= MAX_ABS * (4 if precision == "fp16" else 1)


@pytest.mark.parametrize("passes_off", ["", "conv_concat"])
def test_esrgan_dense_block_on_the_gpu(passes_off: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ESRGAN's dense-block pattern (pass ``conv_concat``: a product per concat part, summed;
    the device's ``supports_op`` asked) on the GPU, against onnxruntime, the pass on and off."""
    device = _gpu()
    spec = importlib.util.spec_from_file_location("conv_concat_cases", HERE / "compiler" / "test_conv_concat.py")
    assert spec is not None and spec.loader is not None
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    monkeypatch.setenv("SDKIT_GGML_PASSES_OFF", passes_off)
    model = cases.dense_block()
    x = np.random.default_rng(1).standard_normal((1, 8, 11, 13)).astype(np.float32)
    want = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString()).run(None, {"x": x})[0]
    got = sdkit.compile(model, backend="ggml", device=device).run({"x": x})["out"]
    assert _rel_l2(got, want) <= REL_L2
