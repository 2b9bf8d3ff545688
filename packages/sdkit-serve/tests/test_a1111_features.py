"""A1111's generation fields through a real client: ``webuiapi`` (the A1111 client on PyPI) and
httpx drive ``sdkit serve``, and every image must equal, bit for bit, the Python API's on the
same inputs and backend: a LoRA/LyCORIS tag and an embedding equal ``load_embedding`` +
``set_loras`` + ``generate``; a mask equals the inpainting call; hires fix equals the pipeline's
hires call; a ControlNet unit equals ``controlnets=`` + ``control=``; eta equals
``sampler_options``."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from serve_helpers import REPO, ServerProcess
from tiny_families import SD1, tiny_family_plugins

import sdkit
from sdkit.plugins import manager

webuiapi = pytest.importorskip("webuiapi")

TINY_XL = REPO / "fixtures" / "tiny_xl"
SD15 = TINY_XL / "sd15"
NETS = TINY_XL / "controlnet"
pytestmark = pytest.mark.skipif(
    not (SD15 / "model_index.json").is_file() or not (SD1 / "sd1_fp16.safetensors").is_file(),
    reason="fixtures/tiny_xl or fixtures/families missing",
)


@pytest.fixture(scope="module")
def backend() -> str:
    """The reference backend: nothing to compile, and these tiny graphs run in milliseconds (the
    comparisons are between the server and the Python API on the same backend)."""
    return "reference"


def client_of(server: ServerProcess) -> Any:
    return webuiapi.WebUIApi(host="127.0.0.1", port=server.port, sampler="Euler", steps=3)


def same(served: Image.Image, expected: Image.Image) -> bool:
    return np.array_equal(np.asarray(served.convert("RGB")), np.asarray(expected.convert("RGB")))


def b64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


# -- LoRAs and embeddings, on the tiny SD 1.x checkpoint ----------------------------------------


@pytest.fixture(scope="module")
def tiny_families() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manager, "_plugins", tiny_family_plugins())
        yield


@pytest.fixture(scope="module")
def lora_server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("lora_server")
    args = ["--model", str(SD1 / "sd1_fp16.safetensors"), "--backend", backend, "--log-level", "warning"]
    args += ["--lora-dir", str(SD1 / "lora"), "--embeddings-dir", str(SD1 / "embeddings")]
    process = ServerProcess(
        args, work / "server.log", isolate=False, launcher=Path(__file__).parent / "tiny_families.py"
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


LORA_PROMPT = "a photo of skstyle riding a horse <lora:sd1_kohya_attn:0.6> <lora:sd1_loha:0.5>"
LORA_REQUEST: dict[str, Any] = {"steps": 2, "seed": 5, "width": 32, "height": 32, "cfg_scale": 7.5}


def test_lora_tags_and_embeddings_equal_the_python_api(
    lora_server: ServerProcess, tiny_families: None, backend: str
) -> None:
    api = client_of(lora_server)
    served = api.txt2img(prompt=LORA_PROMPT, sampler_name="Euler", **LORA_REQUEST)
    plain_served = api.txt2img(prompt="a photo of skstyle riding a horse", sampler_name="Euler", **LORA_REQUEST)
    assert served.info["ignored"] == {}, "webuiapi's default payload must ask for nothing sdkit leaves undone"
    assert served.info["loras"] == [
        {"name": "sd1_kohya_attn", "weight": 0.6, "applied": True},
        {"name": "sd1_loha", "weight": 0.5, "applied": True},  # a LyCORIS (LoHa) file
    ]
    pipe = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend=backend)
    for embedding in sorted((SD1 / "embeddings").glob("*.safetensors")):
        pipe.load_embedding(embedding)
    settings = {"steps": 2, "seed": 5, "width": 32, "height": 32, "guidance_scale": 7.5, "sampler": "euler"}
    plain = pipe.generate("a photo of skstyle riding a horse", **settings)[0]
    pipe.set_loras([(SD1 / "lora" / "sd1_kohya_attn.safetensors", 0.6), (SD1 / "lora" / "sd1_loha.safetensors", 0.5)])
    expected = pipe.generate(LORA_PROMPT, **settings)[0]
    pipe.close()
    assert same(served.image, expected), "txt2img with LoRA tags differs from set_loras + generate"
    assert same(plain_served.image, plain), "the LoRAs were not taken off for the next request"
    assert not same(served.image, plain)
    assert served.image.info["parameters"].startswith(LORA_PROMPT + "\n")  # tags kept in the PNG, as A1111


def test_lora_and_embedding_listings(lora_server: ServerProcess) -> None:
    api = client_of(lora_server)
    names = {item["name"]: item["path"] for item in api.get_loras()}
    assert names["sd1_loha"] == "sd1_loha.safetensors" and "sd1_peft" in names  # relative: no absolute paths
    with lora_server.client() as client:
        assert client.post("/sdapi/v1/refresh-loras").status_code == 200
    embeddings = api.get_embeddings()
    assert set(embeddings["loaded"]) == {"skcat", "skstyle"} and embeddings["skipped"] == {}
    assert embeddings["loaded"]["skstyle"]["vectors"] >= 1 and embeddings["loaded"]["skstyle"]["shape"] > 0


@pytest.mark.parametrize(
    ("prompt", "detail"),
    [
        ("<lora:../lora/sd1_peft:1>", "no ../lora/sd1_peft.safetensors"),
        ("<lora:missing:1>", "no missing.safetensors"),
        ("<lora:sd1_peft:nan>", "finite"),
    ],
)
def test_bad_lora_tags_are_a_400(lora_server: ServerProcess, prompt: str, detail: str) -> None:
    with lora_server.client() as client:
        response = client.post("/sdapi/v1/txt2img", json={"prompt": prompt, **LORA_REQUEST})
    assert response.status_code == 400 and detail in response.json()["detail"], response.text


# -- masks, hires fix, ControlNet, eta, on the tiny SD 1.5 ONNX folder --------------------------


@pytest.fixture(scope="module")
def feature_server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("feature_server")
    args = ["--model", str(SD15), "--backend", backend, "--controlnet-dir", str(NETS), "--log-level", "warning"]
    args += ["--embeddings-dir", str(SD1 / "embeddings")]  # an ONNX export takes none: skipped, with the reason
    process = ServerProcess(args, work / "server.log", isolate=False)
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def sd15(backend: str) -> Iterator[Any]:
    pipe = sdkit.load_pipeline(SD15, backend=backend, controlnets={"sd15_a": NETS / "sd15_a"})
    yield pipe
    pipe.close()


# alwayson_scripts={} in every call: webuiapi's default is one dict shared by all calls, and a call
# with controlnet_units adds the units to it, so later calls would send them again
BASE: dict[str, Any] = {"seed": 7, "steps": 3, "width": 32, "height": 32, "cfg_scale": 5, "alwayson_scripts": {}}
SETTINGS: dict[str, Any] = {"seed": 7, "steps": 3, "width": 32, "height": 32, "guidance_scale": 5, "sampler": "euler"}


def test_hires_fix_equals_the_pipeline(feature_server: ServerProcess, sd15: Any) -> None:
    hires = {"hr_scale": 1.5, "hr_second_pass_steps": 2, "denoising_strength": 0.6}
    served = client_of(feature_server).txt2img(
        prompt="a house", sampler_name="Euler", enable_hr=True, hr_upscaler="Latent (nearest)", **hires, **BASE
    )
    assert served.info["ignored"] == {} and served.image.size == (48, 48)
    expected = sd15.generate("a house", enable_hr=True, hr_upscaler="Latent (nearest)", **hires, **SETTINGS)[0]
    assert same(served.image, expected)
    # the second pass's own sampler, prompts and (Forge's hr_cfg, which webuiapi does not send) CFG
    own = {"hr_sampler_name": "DPM++ 2M", "hr_prompt": "a boat", "hr_negative_prompt": "fog", "hr_cfg": 3.0}
    payload = {"prompt": "a house", "sampler_name": "Euler", "enable_hr": True, **own, **hires, **BASE}
    with feature_server.client() as client:
        body = client.post("/sdapi/v1/txt2img", json=payload).json()
    assert json.loads(body["info"])["ignored"] == {}
    served_own = Image.open(io.BytesIO(base64.b64decode(body["images"][0])))
    fields = {"hr_sampler": "DPM++ 2M", "hr_prompt": "a boat", "hr_negative_prompt": "fog", "hr_guidance_scale": 3.0}
    expected = sd15.generate("a house", enable_hr=True, **fields, **hires, **SETTINGS)[0]
    assert same(served_own, expected) and "Hires sampler: DPM++ 2M" in served_own.info["parameters"]


def test_inpainting_equals_the_pipeline(feature_server: ServerProcess, sd15: Any) -> None:
    init = Image.fromarray(np.random.default_rng(3).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    mask = Image.new("L", (32, 32))
    mask.paste(255, (8, 4, 20, 16))
    served = client_of(feature_server).img2img(
        images=[init], mask_image=mask, mask_blur=2, inpainting_fill=1, inpaint_full_res=True,
        inpaint_full_res_padding=4, denoising_strength=0.6, prompt="a cat", sampler_name="Euler", **BASE,
    )  # fmt: skip
    assert served.info["ignored"] == {}
    expected = sd15.generate(
        "a cat", init_image=init, strength=0.6, mask=np.asarray(mask), mask_blur=2, inpaint_full_res=True,
        inpaint_full_res_padding=4, paste_back=True, **SETTINGS,
    )[0]  # fmt: skip
    assert same(served.image, expected)
    inverted = client_of(feature_server).img2img(
        images=[init], mask_image=Image.eval(mask, lambda v: 255 - v), inpainting_mask_invert=1, mask_blur=2,
        inpainting_fill=1, inpaint_full_res=True, inpaint_full_res_padding=4, denoising_strength=0.6,
        prompt="a cat", sampler_name="Euler", **BASE,
    )  # fmt: skip
    assert same(inverted.image, expected)
    for fill in (0, 2, 3):  # A1111's fill, latent noise, latent nothing
        filled = client_of(feature_server).img2img(
            images=[init], mask_image=mask, mask_blur=2, inpainting_fill=fill, inpaint_full_res=False,
            denoising_strength=0.6, prompt="a cat", sampler_name="Euler", **BASE,
        )  # fmt: skip
        expected = sd15.generate(
            "a cat", init_image=init, strength=0.6, mask=np.asarray(mask), mask_blur=2, inpainting_fill=fill,
            paste_back=True, **SETTINGS,
        )[0]  # fmt: skip
        assert same(filled.image, expected), f"inpainting_fill {fill}"


def test_controlnet_unit_equals_the_pipeline(feature_server: ServerProcess, sd15: Any) -> None:
    photo = Image.fromarray(np.random.default_rng(4).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    unit = webuiapi.ControlNetUnit(
        image=photo, module="canny", model="sd15_a [0123abcd]", weight=0.8, guidance_end=0.5,
        resize_mode="Just Resize", threshold_a=90, threshold_b=180, processor_res=-1,
    )  # fmt: skip
    api = client_of(feature_server)
    fresh = {**BASE, "alwayson_scripts": {}}  # webuiapi adds the units to this dict
    served = api.txt2img(prompt="a cat", sampler_name="Euler", controlnet_units=[unit], **fresh)
    assert served.info["ignored"] == {} and served.info["controlnets"] == ["sd15_a"]
    control = {"image": photo, "model": "sd15_a", "scale": 0.8, "end": 0.5, "preprocessor": "canny"}
    control["preprocessor_params"] = {"low_threshold": 90, "high_threshold": 180}
    expected = sd15.generate("a cat", control=[control], **SETTINGS)[0]
    assert same(served.image, expected)
    assert not same(served.image, sd15.generate("a cat", **SETTINGS)[0])
    assert api.controlnet_model_list() == ["sd15_a", "sd15_b", "sdxl_a", "sdxl_b"]
    assert "canny" in api.controlnet_module_list()
    [edges] = api.controlnet_detect([photo], module="canny", threshold_a=90, threshold_b=180).images
    from sdkit.pipelines.imaging.controlnet_preprocessors import canny

    assert np.array_equal(np.asarray(edges.convert("RGB")), canny(np.asarray(photo), 90, 180))


def test_eta_equals_sampler_options(feature_server: ServerProcess, sd15: Any) -> None:
    with feature_server.client() as client:
        body = client.post("/sdapi/v1/txt2img", json={"prompt": "a cat", "sampler_name": "DDIM", "eta": 0.5, **BASE})
    assert body.status_code == 200, body.text
    served = Image.open(io.BytesIO(base64.b64decode(body.json()["images"][0])))
    assert json.loads(body.json()["info"])["ignored"] == {}
    settings = {**SETTINGS, "sampler": "ddim"}
    expected = sd15.generate("a cat", sampler_options={"eta": 0.5}, **settings)[0]
    assert same(served, expected)
    assert not same(served, sd15.generate("a cat", **settings)[0])  # eta 0: another image


def test_clip_skip_override_equals_the_pipeline(feature_server: ServerProcess, sd15: Any) -> None:
    api = client_of(feature_server)
    served = api.txt2img(
        prompt="a cat", sampler_name="Euler", override_settings={"CLIP_stop_at_last_layers": 2}, **BASE
    )
    assert served.info["ignored"] == {}
    expected = sd15.generate("a cat", clip_skip=2, **SETTINGS)[0]
    assert same(served.image, expected) and "Clip skip: 2" in served.image.info["parameters"]
    assert not same(served.image, sd15.generate("a cat", **SETTINGS)[0])


def test_embeddings_a_model_cannot_take_are_skipped(feature_server: ServerProcess) -> None:
    embeddings = client_of(feature_server).get_embeddings()
    assert embeddings["loaded"] == {} and set(embeddings["skipped"]) == {"skcat", "skstyle"}
    assert "embeddings need a pipeline loaded from" in embeddings["skipped"]["skstyle"]["reason"]
