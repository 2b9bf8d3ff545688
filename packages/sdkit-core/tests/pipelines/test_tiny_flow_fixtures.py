"""The tiny SD3 / Flux / Chroma fixtures (``fixtures/tiny_flow``) are sound.

Oracles: the torch modules' outputs ``make_fixtures.py`` recorded (``components.npz``) for every
exported graph, replayed here with onnxruntime on the recorded inputs (tolerance 1e-4, relative
above 1); diffusers' final latents through the exported VAE decoder give diffusers' image; every
golden's one random draw is sdkit's PCG64 stream. No torch at test time.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.pipelines.models.flux_latents import image_ids, pack, unpack
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_flow"
TOL = 1e-4
ort = pytest.importorskip("onnxruntime")
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_flow missing")
VAE = {
    "sd3": (1.5305, 0.0609),
    "flux_dev": (0.3611, 0.1159),
    "flux_schnell": (0.3611, 0.1159),
    "chroma": (0.3611, 0.1159),
}


@cache
def session(path: str) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(ROOT / path / "model.onnx"), options, providers=["CPUExecutionProvider"])


def scaled_error(ours: np.ndarray, reference: np.ndarray) -> float:
    a, b = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    assert a.shape == b.shape, f"{a.shape} != {b.shape}"
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


def components() -> list[str]:
    return sorted(GOLDENS.meta["components"]) if not GOLDENS.missing else []


@pytest.mark.parametrize("key", components())
def test_onnx_component_matches_torch(key: str) -> None:
    info = GOLDENS.meta["components"][key]
    first, *copies = info["folders"]
    for folder in copies:  # shared components are byte-identical files
        assert (ROOT / folder / "model.onnx").read_bytes() == (ROOT / first / "model.onnx").read_bytes()
    recorded = GOLDENS.npz("components.npz")
    prefix = f"{key}/in/"
    sess = session(first)
    wanted = {i.name for i in sess.get_inputs()}
    feeds = {k[len(prefix) :]: v for k, v in recorded.items() if k.startswith(prefix) and k[len(prefix) :] in wanted}
    assert set(feeds) == wanted
    for name, value in zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True):
        err = scaled_error(value, recorded[f"{key}/out/{name}"])
        assert err <= TOL, f"{key} {name}: {err:.3g}"


def cases() -> list[dict[str, Any]]:
    return list(GOLDENS.meta["cases"]) if not GOLDENS.missing else []


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["key"])
def test_golden_image_is_the_decoded_final_latents(case: dict[str, Any]) -> None:
    """diffusers' last latents (unpacked for Flux/Chroma) through the exported VAE decoder."""
    key, family = case["key"], case["family"]
    latents = GOLDENS.array(f"{key}/step_latents")[-1]
    if latents.ndim == 3:
        latents = unpack(latents, 16, 24)
    scale, shift = VAE[family]
    decoded = session(f"{family}/vae_decoder").run(
        None, {"latent_sample": latents / np.float32(scale) + np.float32(shift)}
    )
    image = np.clip(decoded[0] / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)
    assert scaled_error(image, GOLDENS.array(f"{key}/image")) <= TOL


@pytest.mark.parametrize("case", [c for c in cases() if len(c["draws"]) == 1], ids=lambda c: c["key"])
def test_golden_draw_is_sdkits_stream(case: dict[str, Any]) -> None:
    """txt2img's one draw is sdkit's PCG64 stream: the first transformer call's latents are it
    (packed 2x2 for Flux and Chroma, with diffusers' position ids). img2img's two draws (the VAE
    posterior's, then the noise) meet the encoded image before the transformer sees them: the
    pipeline tests check them through diffusers' images."""
    [draw] = case["draws"]
    first = np.random.Generator(np.random.PCG64(case["seed"])).standard_normal(draw["shape"], dtype=np.float32)
    call = f"{case['key']}/transformer_call0"
    fed = GOLDENS.array(f"{call}/hidden_states")[:1]
    if case["family"] == "sd3":
        assert np.array_equal(fed, first)
    else:
        assert np.array_equal(fed, pack(first))
        assert np.array_equal(unpack(pack(first), 16, 24), first)
        assert np.array_equal(GOLDENS.array(f"{call}/img_ids"), image_ids(16, 24))
