"""The tiny SDXL / refiner / inpainting / ControlNet fixtures (``fixtures/tiny_xl``) are sound.

Oracles: the torch modules' outputs that ``make_fixtures.py`` recorded (``components.npz``) for
every exported ONNX graph, run here with onnxruntime on the recorded inputs (tolerance 1e-4,
relative above 1); and diffusers' final latents and images (``golden.npz``), which the exported
VAE decoder must turn into the same image. No torch at test time.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
TOL = 1e-4
ort = pytest.importorskip("onnxruntime")
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")
golden = GOLDENS.array


def graphs() -> list[str]:
    if not ROOT.is_dir():
        return []
    return sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.rglob("model.onnx"))


@cache
def session(path: str) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(ROOT / path / "model.onnx"), options, providers=["CPUExecutionProvider"])


def scaled_error(ours: np.ndarray, reference: np.ndarray) -> float:
    a, b = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    assert a.shape == b.shape, f"{a.shape} != {b.shape}"
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


@pytest.mark.parametrize("component", graphs())
def test_onnx_component_matches_torch(component: str) -> None:
    record_key = GOLDENS.meta["component_refs"].get(component, component)
    if record_key != component:  # an identical graph (same bytes) holds the record
        assert (ROOT / component / "model.onnx").read_bytes() == (ROOT / record_key / "model.onnx").read_bytes()
    recorded = GOLDENS.npz("components.npz")
    prefix = f"{record_key}/in/"
    feeds = {k[len(prefix) :]: v for k, v in recorded.items() if k.startswith(prefix)}
    sess = session(component)
    assert [i.name for i in sess.get_inputs()] == list(feeds)
    names = [o.name for o in sess.get_outputs()]
    for name, value in zip(names, sess.run(None, feeds), strict=True):
        err = scaled_error(value, recorded[f"{record_key}/out/{name}"])
        assert err <= TOL, f"{component} {name}: {err:.3g}"


EXPECTED_IO = {
    "sdxl/unet": (["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"], ["out_sample"]),
    "sdxl_refiner/unet": (["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"], ["out_sample"]),
    "sd15/unet": (["sample", "timestep", "encoder_hidden_states"], ["out_sample"]),
    "sdxl/text_encoder": (
        ["input_ids"],
        ["last_hidden_state", "pooler_output", *[f"hidden_states.{i}" for i in range(6)]],
    ),
    "sdxl/text_encoder_2": (
        ["input_ids"],
        ["text_embeds", "last_hidden_state", *[f"hidden_states.{i}" for i in range(6)]],
    ),
    "sdxl/vae_decoder": (["latent_sample"], ["sample"]),
    "sdxl/vae_encoder": (["sample"], ["latent_parameters"]),
}


@pytest.mark.parametrize("component", sorted(EXPECTED_IO))
def test_optimum_names(component: str) -> None:
    sess = session(component)
    inputs, outputs = EXPECTED_IO[component]
    assert [i.name for i in sess.get_inputs()] == inputs
    assert [o.name for o in sess.get_outputs()] == outputs


def test_controlnet_residuals_fit_the_unet() -> None:
    for base, net in (("sd15", "controlnet/sd15_a"), ("sdxl", "controlnet/sdxl_b")):
        outs = [o.name for o in session(net).get_outputs()]
        ins = [i.name for i in session(f"{base}/unet_controlnet").get_inputs()]
        assert [n.replace("res_sample", "additional_residual") for n in outs] == [n for n in ins if "residual" in n]
    assert session("sd15_inpaint/unet").get_inputs()[0].shape[1] == 9


def cases() -> list[dict[str, Any]]:
    return list(GOLDENS.meta["cases"]) if not GOLDENS.missing else []


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["key"])
def test_golden_image_is_the_decoded_final_latents(case: dict[str, Any]) -> None:
    """diffusers' last latents through the exported VAE decoder give diffusers' image."""
    folder = "sdxl" if case["family"].startswith("sdxl") else "sd15"
    config = json.loads((ROOT / folder / "vae_decoder" / "config.json").read_text(encoding="utf-8"))
    latents = golden(f"{case['key']}/step_latents")[-1]
    decoded = session(f"{folder}/vae_decoder").run(
        None, {"latent_sample": latents / np.float32(config["scaling_factor"])}
    )
    image = np.clip(decoded[0] / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)
    assert scaled_error(image, golden(f"{case['key']}/image")) <= TOL


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["key"])
def test_golden_draws_are_sdkits_stream(case: dict[str, Any]) -> None:
    """Every diffusers draw was sdkit's PCG64 stream, in order: the txt2img start latents in the
    first UNet call are the first draw times the scheduler's init_noise_sigma."""
    draws = case["draws"]
    assert draws and all(len(d["shape"]) == 4 for d in draws)
    if case["family"] in ("sdxl", "sd15_txt2img", "sd15_controlnet", "sdxl_controlnet", "sdxl_refiner"):
        first = np.random.Generator(np.random.PCG64(case["seed"])).standard_normal(draws[0]["shape"], dtype=np.float32)
        latents = golden(f"{case['key']}/unet0/sample")
        ratio = latents / first  # init_noise_sigma, then scale_model_input's 1 / sqrt(sigma^2 + 1)
        assert np.allclose(ratio, ratio.flat[0], rtol=1e-5)
