"""End-to-end on an NVIDIA GPU (marked ``gpu``; skipped where the backend is unavailable).

Oracle: onnxruntime CPU on the same fp32 graph and weights. Tolerances: fp32 engines are
built with TF32 off, so ~1e-4 on the TAEF2 image (values in [0, 1]); fp16 engines ~2e-2.
Unverified in the session that wrote them (no GPU was lent): run with ``pytest -m gpu``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from trt_helpers import REPO, run_ort

from sdkit.errors import InputError
from sdkit.model import Model, load_onnx
from sdkit.options import make_options
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.compiled import TrtCompiledModel

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> TensorRTBackend:
    backend = TensorRTBackend()
    availability = backend.probe()
    if not availability.ok:
        pytest.skip(f"tensorrt backend unavailable: {availability.reason}")
    return backend


def compile_model(backend: TensorRTBackend, model: Model, **options: object) -> TrtCompiledModel:
    device = backend.devices()[0]
    compiled = backend.compile(model.graph, model.weights, device, make_options(options, backend.extra_options))
    assert isinstance(compiled, TrtCompiledModel)
    return compiled


def taef2_decoder(taef2: Path, size: int = 32) -> tuple[Model, dict[str, np.ndarray]]:
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    model = Model(model.graph.with_input_shapes({"latent": (1, 32, size, size)}), model.weights)
    latent = np.ascontiguousarray(np.load(taef2 / "dog_latent_torch.npy")[:, :, :size, :size])
    return model, {"latent": latent}


@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-4), ("fp16", 2e-2)])
def test_taef2_matches_onnxruntime(
    backend: TensorRTBackend, taef2: Path, sdkit_isolated: Path, precision: str, atol: float
) -> None:
    model, feeds = taef2_decoder(taef2)
    want = run_ort(model.graph.to_onnx(model.weights), feeds)[0]
    with compile_model(backend, model, precision=precision) as compiled:
        got = compiled.run(feeds)["image"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=atol)


def test_refit_swaps_every_weight_and_rejects_bad_sets(
    backend: TensorRTBackend, taef2: Path, sdkit_isolated: Path
) -> None:
    model, feeds = taef2_decoder(taef2, 16)
    rng = np.random.default_rng(0)
    noise = {
        n: (rng.standard_normal(a.shape) * 0.05).astype(a.dtype) if a.dtype == np.float32 and a.size > 64 else a
        for n, a in model.weights.items()
    }
    noisy = model.with_weights(noise)
    with compile_model(backend, noisy) as compiled:
        before = compiled.run(feeds)["image"]
        compiled.refit(model.weights)
        after = compiled.run(feeds)["image"]
        want = run_ort(model.graph.to_onnx(model.weights), feeds)[0]
        np.testing.assert_allclose(after, want, atol=1e-4)
        assert np.abs(before - want).max() > 1e-2  # the first weights really were different
        compiled.refit(noisy.weights)  # back again: from the full set, nothing accumulates
        np.testing.assert_allclose(compiled.run(feeds)["image"], before, atol=1e-5)
        partial = dict(model.weights)
        partial.pop(next(iter(partial)))
        with pytest.raises(InputError, match="missing"):
            compiled.refit(partial)  # type: ignore[arg-type]
        name = next(n for n, a in model.weights.items() if a.ndim == 4)
        with pytest.raises(InputError, match=name):
            compiled.refit(model.weights.updated({name: np.zeros((1, 1, 1, 1), np.float32)}, strict=False))


def test_second_compile_hits_the_cache(backend: TensorRTBackend, taef2: Path, sdkit_isolated: Path) -> None:
    model, feeds = taef2_decoder(taef2, 16)
    start = time.perf_counter()
    with compile_model(backend, model) as first:
        first.run(feeds)
        cold = time.perf_counter() - start
        assert first.cache_hits == [False]
    start = time.perf_counter()
    with compile_model(backend, model) as second:
        second.run(feeds)
        warm = time.perf_counter() - start
        assert second.cache_hits == [True]
    print(f"TAEF2 16x16 compile+first run: cold {cold:.2f} s, cached {warm:.2f} s")
    assert warm < cold
    assert any(
        p.name.startswith("runtime-") or p.name.startswith("timing-") for p in (sdkit_isolated / "tensorrt").iterdir()
    )


def test_dynamic_shapes_per_signature_and_profiles(backend: TensorRTBackend, taef2: Path, sdkit_isolated: Path) -> None:
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    latent = np.load(taef2 / "dog_latent_torch.npy")
    with compile_model(backend, model) as per_signature:
        for size in (8, 16):
            feeds = {"latent": np.ascontiguousarray(latent[:, :, :size, :size])}
            want = run_ort(model.graph.to_onnx(model.weights), feeds)[0]
            np.testing.assert_allclose(per_signature.run(feeds)["image"], want, atol=1e-4)
        assert len(per_signature.engines) == 2
    profile = {"latent": ((1, 32, 8, 8), (1, 32, 16, 16), (1, 32, 32, 32))}
    with compile_model(backend, model, profiles=profile) as ranged:
        for size in (8, 24):
            feeds = {"latent": np.ascontiguousarray(latent[:, :, :size, :size])}
            want = run_ort(model.graph.to_onnx(model.weights), feeds)[0]
            np.testing.assert_allclose(ranged.run(feeds)["image"], want, atol=1e-4)
        with pytest.raises(InputError, match="outside the compiled profile"):
            ranged.run({"latent": np.ascontiguousarray(latent[:, :, :40, :40])})


def test_sd_vae_decoder_matches_onnxruntime(backend: TensorRTBackend, sdkit_isolated: Path) -> None:
    sys.path.insert(0, str(REPO / "fixtures"))
    try:
        import sd_graphs  # type: ignore[import-not-found]

        proto = sd_graphs.load_model("sd15_vae_decoder", seed=0)
    except Exception as exc:  # the fixture package or its cache is not there
        pytest.skip(f"SD VAE decoder fixture unavailable: {exc}")
    finally:
        sys.path.remove(str(REPO / "fixtures"))
    model = Model.from_proto(proto)
    model = Model(model.graph.with_input_shapes({model.inputs[0].name: (1, 4, 32, 32)}), model.weights)
    feeds = {model.inputs[0].name: np.random.default_rng(0).standard_normal((1, 4, 32, 32)).astype(np.float32)}
    want = run_ort(model.graph.to_onnx(model.weights), feeds)[0]
    scale = float(np.abs(want).max())
    for precision, rtol in (("fp32", 1e-3), ("fp16", 3e-2)):
        with compile_model(backend, model, precision=precision) as compiled:
            got = next(iter(compiled.run(feeds).values()))
        np.testing.assert_allclose(got, want, atol=rtol * scale)


@pytest.mark.parametrize("family", ["flux_dev", "chroma"])
def test_fp8_tiny_transformer_within_the_e4m3_bound(
    backend: TensorRTBackend, sdkit_isolated: Path, family: str
) -> None:
    """precision="fp8" on a GPU of compute capability 8.9+: within 2^-4 of onnxruntime fp32
    (the bound test_fp8.py holds onnxruntime's run of the same graph to), and a refit with other
    weights either re-quantizes them or is refused naming them."""
    device = backend.devices()[0]
    gpu = backend._assigned()[device.index or 0][0]
    if gpu.compute_capability < (8, 9):
        pytest.skip(f"fp8 needs compute capability 8.9+, {gpu.describe()}")
    folder = REPO / "fixtures" / "tiny_flow"
    model = load_onnx(folder / family / "transformer" / "model.onnx")
    components = np.load(folder / "components.npz")
    feeds = {i.name: components[f"{family}/in/{i.name}"].astype(i.dtype) for i in model.graph.inputs}

    def rel_l2(got: np.ndarray, other: Model) -> float:
        want = run_ort(other.graph.to_onnx(other.weights), feeds)[0]
        return float(np.linalg.norm(got - want) / np.linalg.norm(want))

    with compile_model(backend, model, precision="fp8") as compiled:
        got = compiled.run(feeds)["out_hidden_states"]
        print(f"{family} fp8 on {gpu.name}: rel-L2 {rel_l2(got, model):.4f}")
        assert rel_l2(got, model) < 2.0**-4
        scaled = model.with_weights({n: a * 0.5 if a.ndim == 2 else a for n, a in model.weights.items()})
        baked = set().union(*(b for _, b in compiled.engines.values()))
        if any(model.weights[n].ndim == 2 for n in baked):  # TensorRT folded fp8 weights/scales
            with pytest.raises(InputError, match="fp8 weight scales"):
                compiled.refit(scaled.weights)
        else:
            compiled.refit(scaled.weights)
            assert rel_l2(compiled.run(feeds)["out_hidden_states"], scaled) < 2.0**-4


@pytest.mark.slow  # one engine build per case: minutes
def test_onnx_node_conformance_for_sd_operators(backend: TensorRTBackend, sdkit_isolated: Path) -> None:
    """onnx.backend.test node cases of the operator families SD graphs use, on cuda:0.
    Failures here name the cases to fix or to list, with their reason, in an exclusion file."""
    from sdkit.testing import run_conformance

    families = [
        "conv", "relu", "add", "mul", "sub", "div", "resize", "instancenorm", "layer_normalization",
        "group_normalization", "matmul", "gemm", "softmax", "sigmoid", "tanh", "erf", "concat",
        "reshape", "transpose", "gather", "slice", "split", "cast", "where", "expand", "pow", "sqrt",
    ]  # fmt: skip
    include = [rf"^test_{f}(_.*)?_cuda$" for f in families]
    result = run_conformance("tensorrt", include=include, device="cuda:0")
    print(result.summary())
    assert result.executed >= 100, result.summary()
    assert not result.failed, "\n".join(f"{k}: {v}" for k, v in sorted(result.failed.items()))
