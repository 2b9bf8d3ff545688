"""The SD graphs, TAEF2 and the tiny SD 1.x, SDXL and Flux pipelines on ggml's Vulkan backend.

Marked ``vulkan``; each test skips unless the loaded ggml lists a ``vulkan:N`` device. Where
ggml is built with Vulkan (``python -m sdkit_ggml.runtime.native_build --vulkan``,
``SDKIT_GGML_LIB_DIR``), ``python3 dev.py vulkan`` runs them, on Mesa's lavapipe (a Vulkan
driver running on the CPU; ggml-vulkan lists a CPU-type device only when
``GGML_VK_VISIBLE_DEVICES`` names it) or on any GPU's Vulkan driver.

The oracles are the CPU's: onnxruntime fp32 on the same graphs, diffusers' goldens for the
pipelines. ``dev.py vulkan`` runs the file twice, once per precision mode of ggml-vulkan:

- default: where the device has F16 arithmetic, ggml-vulkan 0.20.2 stores the operands of F32
  matrix products as F16 in its shader tiles (10-bit mantissa, F32 accumulation; CUDA's TF32
  keeps the same mantissa), so a lone 256x256 product is off by 3e-4 relative max, and the
  graphs here land at relative L2 2e-4 to 1.3e-3 on lavapipe (Mesa 25.0.7, 2026-11-28; under
  1e-5 on ggml's CPU backend). Graph bars: the CUDA tests' (``test_gpu.py``) for the same reason.
  The pipelines then hold 1e-2 on the image (measured up to 2.0e-3: tiny SD 1.x) and 1e-2 on
  each step's latents relative to their largest value (measured up to 5.2e-4: SDXL).
- ``GGML_VK_DISABLE_F16`` set (ggml-vulkan's own switch, read when the device opens; any value,
  even 0): F32 shader tiles, a lone product within 6e-7; every test then holds the CPU's bars
  (graphs rel-L2 1e-5, measured up to 1.9e-6; pipelines 1e-3 on the image and 1e-4 on each
  step's latents, as in sdkit-core's golden tests).

The full-size SD 1.5 VAE graphs are marked ``slow`` as well: lavapipe compiles each compute
pipeline with LLVM the first time it runs, and one of the matrix-product pipelines those graphs
need was still compiling after 10 minutes at 7.5 GB on a 2-core machine. The tiny pipeline's VAE
(the same architecture at test width) covers the VAE on lavapipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.model import Model, load_onnx
from sdkit.testing.goldens import GoldenSet, StepRecorder

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.vulkan

ROOT = Path(__file__).resolve().parents[3]
import os  # noqa: E402

EXACT = "GGML_VK_DISABLE_F16" in os.environ  # ggml-vulkan asks whether it is set, not its value
REL_L2 = 1e-5 if EXACT else 5e-3  # F16-rounded operands: ~4x the worst measured on lavapipe
REL_L2_FP16_WEIGHTS = 2e-2  # fp16 weights too: TAEF2's encoder measured 7.1e-3 (decoder 2.9e-3)
# (image, step latents) max |diff| vs diffusers' goldens; F16 mode: 5x the worst image measured,
# latents relative to their largest value, both under half the smallest change the goldens record
# for a changed input (tiny_xl 1.9e-2, tiny_flow 2.5e-2: sensitivity_max_abs_diff)
PIPELINE_TOLERANCE = (1e-3, 1e-4) if EXACT else (1e-2, 1e-2)
# Small shapes: lavapipe runs compute shaders on the CPU, ~10-50x slower than ggml's CPU backend.
LATENT = 8  # SD VAE latent side (64 px images)
TAEF2_LATENT = 16


def vulkan_device() -> str:
    from sdkit_ggml.backend import GgmlBackend

    found = [d for d in GgmlBackend().devices() if d.kind == "vulkan"]
    if not found:
        pytest.skip("ggml lists no Vulkan device (python -m sdkit_ggml.runtime.native_build --vulkan)")
    return str(found[0])


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def sd_feeds(sd_graphs: Any, name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    if name.endswith("vae_decoder"):
        return {"latent_sample": rng.standard_normal((1, 4, LATENT, LATENT), dtype=np.float32)}
    if name.endswith("vae_encoder"):
        return {"sample": rng.uniform(-1, 1, (1, 3, 8 * LATENT, 8 * LATENT)).astype(np.float32)}
    feeds: dict[str, np.ndarray] = sd_graphs.example_inputs(name)
    return feeds


def load_graph(sd_graphs: Any, name: str) -> Any:
    """A graph of ``fixtures/sd`` (random weights filled in), or ``tiny_vae_*``: the tiny
    pipeline's VAE (``fixtures/tiny_pipeline``, diffusers' weights)."""
    if name.startswith("tiny_vae_"):
        import onnx

        return onnx.load(str(ROOT / "fixtures" / "tiny_pipeline" / "model" / name[5:] / "model.onnx"))
    return sd_graphs.load_model(name)


def onnxruntime_run(proto: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    result: list[np.ndarray] = session.run(None, feeds)
    return result


@pytest.mark.parametrize("last", [0, 1])
def test_argmax_ties_follow_onnx_on_vulkan(last: int) -> None:
    """ONNX's tie rule (first maximum, or the last with select_last_index), not the device's:
    a CLIP's pooled output is an ArgMax over ids padded with the end token (ties everywhere),
    and ggml-vulkan's argmax keeps another of equal maxima than ggml's CPU backend."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0, select_last_index=last)
    graph = helper.make_graph([node], "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 77])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.ones((3, 77), dtype=np.float32)
    x[0, :5] = [5, 9, 2, 9, 1]  # then a run of ones: the tied maxima are 9 at 1 and 3
    x[1] = 7.0  # every element ties
    x[2, 40:] = 3.0
    got = sdkit.compile(Model.from_proto(proto), backend="ggml", device=vulkan_device()).run({"x": x})["y"]
    want = onnxruntime_run(proto, {"x": x})[0]
    assert onnx.checker.check_model(proto) is None
    np.testing.assert_array_equal(got, want)


FULL_SIZE = pytest.mark.slow
GRAPHS = [
    "tiny_clip_text",
    "tiny_unet",
    "tiny_controlnet",
    "tiny_vae_encoder",
    "tiny_vae_decoder",
    pytest.param("sd15_vae_encoder", marks=FULL_SIZE),
    pytest.param("sd15_vae_decoder", marks=FULL_SIZE),
]


@pytest.mark.parametrize("passes_off", ["", "conv_concat"])
def test_esrgan_dense_block_on_vulkan(passes_off: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ESRGAN's dense-block pattern (pass ``conv_concat``: one product per concat part, summed,
    the device's ``supports_op`` asked) against onnxruntime, the pass on and off."""
    import importlib.util

    device = vulkan_device()
    path = Path(__file__).resolve().parent / "compiler" / "test_conv_concat.py"
    spec = importlib.util.spec_from_file_location("conv_concat_cases", path)
    assert spec is not None and spec.loader is not None
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    monkeypatch.setenv("SDKIT_GGML_PASSES_OFF", passes_off)
    model = cases.dense_block()
    x = np.random.default_rng(1).standard_normal((1, 8, 11, 13)).astype(np.float32)
    (want,) = onnxruntime_run(model.graph.to_onnx(model.weights), {"x": x})
    got = sdkit.compile(model, backend="ggml", device=device).run({"x": x})["out"]
    assert rel_l2(got, want) <= REL_L2


@pytest.mark.parametrize("name", GRAPHS)
def test_sd_graphs_on_vulkan(sd_graphs: Any, name: str) -> None:
    device = vulkan_device()
    proto, feeds = load_graph(sd_graphs, name), sd_feeds(sd_graphs, name)
    model = Model.from_proto(proto)
    compiled = sdkit.compile(model, backend="ggml", device=device)
    got = compiled.run(feeds)
    for info, want in zip(model.outputs, onnxruntime_run(proto, feeds), strict=True):
        error = rel_l2(got[info.name], want)
        print(f"{name}.{info.name} on {device}: rel-L2 {error:.3g}")
        assert error <= REL_L2, info.name
    compiled.close()


@pytest.mark.parametrize(("part", "shape"), [("decoder", (1, 32, TAEF2_LATENT, TAEF2_LATENT)),
                                             ("encoder", (1, 3, 8 * TAEF2_LATENT, 8 * TAEF2_LATENT))])  # fmt: skip
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_taef2_on_vulkan(taef2: Path, part: str, shape: tuple[int, ...], precision: str) -> None:
    """TAEF2 (real weights) against onnxruntime fp32; fp16 weights within F16's rounding."""
    device = vulkan_device()
    path = taef2 / f"taef2_{part}.onnx"
    model = load_onnx(path)
    rng = np.random.default_rng(3)
    feeds = {model.inputs[0].name: rng.uniform(-1, 1, shape).astype(np.float32)}
    compiled = sdkit.compile(model, backend="ggml", device=device, precision=precision)
    got = compiled.run(feeds)[model.outputs[0].name]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    error = rel_l2(got, want)
    print(f"taef2 {part} {precision} on {device}: rel-L2 {error:.3g}, max |diff| {np.abs(got - want).max():.3g}")
    # fp16 weights on the CPU: rel-L2 2.4e-4 (packages/sdkit-ggml/README.md); 5e-3 is the CPU tests' bar
    assert error <= (REL_L2 if precision == "fp32" else 5e-3 if EXACT else REL_L2_FP16_WEIGHTS)
    compiled.close()


def _check(goldens: GoldenSet, key: str, pipe: Any, kwargs: dict[str, Any], convert: Any = None) -> None:
    steps = StepRecorder()
    image = pipe.generate(goldens.case(key)["prompt"], **kwargs, callback=steps)
    if EXACT:  # the CPU's bars, absolute
        goldens.check(key, image, steps, PIPELINE_TOLERANCE, "vulkan", convert=convert)
        return
    diff = float(np.abs(image - goldens.array(f"{key}/image")).max())
    want = goldens.array(f"{key}/step_latents")
    want = want[~np.isnan(want).reshape(len(want), -1).any(axis=1)]
    assert len(steps.latents) == len(want), f"{key}: {len(steps.latents)} steps, golden {len(want)}"
    errors = [float(np.abs((convert(ours, theirs) if convert else ours) - theirs).max() / np.abs(theirs).max())
              for ours, theirs in zip(steps.latents, want, strict=True)]  # fmt: skip
    print(f"{key} on vulkan (F16 tiles): image max |diff| {diff:.3g}, step latents relative {max(errors):.3g}")
    assert diff <= PIPELINE_TOLERANCE[0] and max(errors) <= PIPELINE_TOLERANCE[1], (diff, errors)


def test_tiny_sd_pipeline_on_vulkan() -> None:
    """SD 1.x txt2img (CLIP, UNet with CFG, VAE decoder) against diffusers' golden."""
    device = vulkan_device()
    goldens = GoldenSet(ROOT / "fixtures" / "tiny_pipeline")
    c = goldens.meta["cases"][0]
    assert (c["sampler"], c["mode"]) == ("euler", "txt2img")
    pipe = sdkit.load_pipeline(goldens.root / "model", backend="ggml", device=device)
    assert {b for b in pipe.backends().values() if b} == {"ggml"}  # None: a component not loaded
    kwargs = {k: c[k] for k in ("negative_prompt", "seed", "steps", "guidance_scale", "sampler", "width", "height")}
    image = pipe.generate(c["prompt"], schedule=c["schedule"], output_type="np", **kwargs)
    want = goldens.npz()["case0_image"]
    diff = float(np.abs(image - want).max())
    print(f"tiny SD 1.x on {device}: max |diff| {diff:.3g}")
    assert diff <= PIPELINE_TOLERANCE[0]
    pipe.close()


def test_tiny_sdxl_on_vulkan() -> None:
    device = vulkan_device()
    goldens = GoldenSet(ROOT / "fixtures" / "tiny_xl")
    key = "sdxl_euler"
    c = goldens.case(key)
    pipe = sdkit.load_pipeline(goldens.root / "sdxl", backend="ggml", device=device)
    kwargs: dict[str, Any] = {
        name: c[name]
        for name in ("negative_prompt", "prompt_2", "seed", "steps", "guidance_scale", "sampler", "width", "height",
                     "original_size", "crops_coords_top_left", "target_size", "negative_original_size",
                     "negative_crops_coords_top_left", "negative_target_size")
        if name in c
    }  # fmt: skip
    _check(goldens, key, pipe, {**kwargs, "output_type": "np"})
    pipe.close()


def test_tiny_flux_on_vulkan() -> None:
    from sdkit.pipelines.models.flux_latents import pack

    device = vulkan_device()
    goldens = GoldenSet(ROOT / "fixtures" / "tiny_flow")
    key = "flux_dev"
    c = goldens.case(key)
    pipe = sdkit.load_pipeline(goldens.root / "flux_dev", backend="ggml", device=device)
    kwargs = {name: c[name] for name in ("seed", "steps", "guidance_scale", "width", "height", "max_sequence_length")}
    kwargs.update(negative_prompt=c["negative_prompt"] or "", output_type="np")

    def packed_like(latents: np.ndarray, golden_latents: np.ndarray) -> np.ndarray:
        return pack(latents) if golden_latents.ndim == 3 else latents

    _check(goldens, key, pipe, kwargs, convert=packed_like)
    pipe.close()
