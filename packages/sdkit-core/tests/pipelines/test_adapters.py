"""``Pipeline.set_loras`` / ``load_embedding`` / ``set_vae`` on a pipeline loaded from a tiny SD 1.x
checkpoint, on the reference, ggml and openvino backends.

Oracle: diffusers (``fixtures/families/tiny/sd1/adapters.npz``: ``load_lora_weights`` +
``fuse_lora``, ``load_textual_inversion``, ``AutoencoderKL.from_single_file``), max |diff| <= 1e-4
on the compiled components' outputs; removing every LoRA gives the base output bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.families import Family
from sdkit.pipelines.features.lora_embeddings_vae import prompt_loras
from sdkit.testing.goldens import require_backend

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
SD1 = TINY / "sd1"
TOLERANCE = 1e-4
OPTIONS: dict[str, dict[str, Any]] = {"ggml": {"threads": 1}}


def _goldens() -> dict[str, np.ndarray]:
    with np.load(SD1 / "adapters.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _unet(pipe: Any, goldens: dict[str, np.ndarray]) -> np.ndarray:
    feeds = {k.rpartition("/")[2]: v for k, v in goldens.items() if k.startswith("sd1/inputs/unet/")}
    out: np.ndarray = pipe.components["unet"].run(feeds)["out_sample"]
    return out


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_loras_refit_and_removing_them_gives_the_base_bit_exactly(
    tiny_families: dict[str, Family], backend: str
) -> None:
    require_backend(backend)
    goldens = _goldens()
    pipe = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend=backend, **OPTIONS.get(backend, {}))
    base = _unet(pipe, goldens)
    engine = pipe.components["unet"].compiled
    locon = SD1 / "lora" / "sd1_kohya_locon.safetensors"
    swaps = pipe.set_loras([(locon, 0.5)])
    assert swaps["unet"] == "refit" and pipe.components["unet"].compiled is engine
    first = _unet(pipe, goldens)
    assert np.abs(first - goldens["lora/sd1_kohya_locon@0.5/unet/out_sample"]).max() <= TOLERANCE
    pipe.set_loras([(locon, 0.5)])
    assert np.array_equal(_unet(pipe, goldens), first)
    two = [(locon, 1.0), (SD1 / "lora" / "sd1_peft.safetensors", 0.5)]
    pipe.set_loras(two)
    expected = goldens["lora/sd1_kohya_locon@1.0+sd1_peft@0.5/unet/out_sample"]
    assert np.abs(_unet(pipe, goldens) - expected).max() <= TOLERANCE
    assert pipe.set_loras([])["unet"] == "refit"
    assert np.array_equal(_unet(pipe, goldens), base)
    assert pipe.components["unet"].compiled is engine


def test_embedding_lora_tags_and_vae_in_a_generation(tiny_families: dict[str, Family]) -> None:
    goldens = _goldens()
    pipe = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend="reference")
    for name in ("skstyle", "skcat"):
        pipe.load_embedding(SD1 / "embeddings" / f"{name}.safetensors")
    prompt = "a photo of skstyle and skcat riding a horse <lora:sd1_kohya_attn:0.6>"
    hidden = pipe.encode_prompts([prompt])  # the tag is no text for the encoder
    assert np.abs(hidden - goldens["embeddings/text_encoder/last_hidden_state"]).max() <= TOLERANCE
    pipe.set_loras(prompt_loras(prompt, SD1 / "lora"))
    pipe.set_vae(SD1 / "vae" / "vae_ldm_fp16.safetensors")
    latent = goldens["sd1/inputs/vae_decoder/latent_sample"]
    decoded = pipe.components["vae_decoder"].run({"latent_sample": latent})["sample"]
    assert np.abs(decoded - goldens["vae/vae_ldm_fp16/vae_decoder/sample"]).max() <= TOLERANCE
    images = pipe(prompt, steps=2, width=32, height=32, seed=3, sampler="euler")
    assert images[0].info["parameters"].startswith(prompt + "\n")  # A1111 keeps the tags in the prompt
    assert set(pipe.set_vae(None)) == {"text_encoder", "unet", "vae_decoder", "vae_encoder"}
    assert pipe.components["vae_decoder"]._weights is None


def test_a_decoder_only_vae_file_drops_the_checkpoints_encoder(
    tiny_families: dict[str, Family], tmp_path: Path
) -> None:
    """Both VAE halves come from the ``set_vae`` file (A1111, ComfyUI): a decoder-only file
    releases the checkpoint's encoder rather than pair it with the new decoder (img2img is then
    refused naming the key the file lacks; the decoder is the file's); a full file or ``None``
    makes the encoder again, with the file's or the checkpoint's weights."""
    import gc
    import weakref

    from PIL import Image
    from safetensors.numpy import load_file, save_file

    goldens = _goldens()
    with np.load(SD1 / "goldens.npz", allow_pickle=False) as data:
        base = data["sd1_fp16/vae_encoder/latent_parameters"]
    full = SD1 / "vae" / "vae_ldm_fp16.safetensors"
    decoder_only = tmp_path / "vae_decoder_only.safetensors"
    save_file({k: v for k, v in load_file(str(full)).items() if not k.startswith("encoder.")}, str(decoder_only))
    sample = {"sample": goldens["sd1/inputs/vae_encoder/sample"]}
    latent = {"latent_sample": goldens["sd1/inputs/vae_decoder/latent_sample"]}
    pipe = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend="reference")
    try:
        pipe.components["vae_encoder"].prepare()
        compiled = weakref.ref(pipe.components["vae_encoder"].compiled)
        assert set(pipe.set_vae(decoder_only)) == {"vae_decoder"}
        gc.collect()
        assert "vae_encoder" not in pipe.components and compiled() is None
        decoded = pipe.components["vae_decoder"].run(latent)["sample"]
        assert np.abs(decoded - goldens["vae/vae_ldm_fp16/vae_decoder/sample"]).max() <= TOLERANCE
        assert pipe("a cat", steps=1, width=32, height=32)[0].size == (32, 32)  # txt2img runs
        with pytest.raises(ModelFormatError) as err:
            pipe("a cat", init_image=Image.new("RGB", (32, 32)), strength=0.5, steps=1)
        message = str(err.value)
        assert "vae_decoder_only.safetensors, is decoder-only (no encoder.conv_in.weight)" in message
        assert "txt2img runs without it" in message
        with pytest.raises(ModelFormatError, match=r"Lanczos upscaler .*vae_decoder_only.safetensors, is decoder-only"):
            pipe("a cat", steps=1, width=32, height=32, enable_hr=True, hr_scale=1.5, hr_upscaler="Lanczos")
        pipe.set_vae(full)
        encoded = pipe.components["vae_encoder"].run(sample)["latent_parameters"]
        assert np.abs(encoded - goldens["vae/vae_ldm_fp16/vae_encoder/latent_parameters"]).max() <= TOLERANCE
        pipe.set_vae(decoder_only)
        assert "vae_encoder" not in pipe.components
        pipe.set_vae(None)
        encoded = pipe.components["vae_encoder"].run(sample)["latent_parameters"]
        assert np.abs(encoded - base).max() <= TOLERANCE
    finally:
        pipe.close()


def test_set_checkpoint_keeps_the_adapters(tiny_families: dict[str, Family]) -> None:
    goldens = _goldens()
    pipe = sdkit.load_pipeline(SD1 / "sd1_bf16.safetensors", backend="reference")
    pipe.set_loras([(SD1 / "lora" / "sd1_peft.safetensors", 1.0)])
    pipe.set_checkpoint(SD1 / "sd1_fp16.safetensors")  # the LoRA is merged on the new base
    assert np.abs(_unet(pipe, goldens) - goldens["lora/sd1_peft@1.0/unet/out_sample"]).max() <= TOLERANCE


def test_adapters_need_a_checkpoint_pipeline(tiny_dir: Path) -> None:
    pipe = sdkit.load_pipeline(tiny_dir, backend="reference")
    with pytest.raises(ModelFormatError, match=r"LoRAs need a pipeline loaded from a .safetensors checkpoint"):
        pipe.set_loras([(SD1 / "lora" / "sd1_peft.safetensors", 1.0)])


def test_prompt_lora_tags(tmp_path: Path) -> None:
    (tmp_path / "styles").mkdir()
    (tmp_path / "styles" / "ink.safetensors").write_bytes(b"")
    (tmp_path / "old.pt").write_bytes(b"")
    assert prompt_loras("a cat <lora:ink:0.8>, <LORA:ink> <hypernet:x:1>", tmp_path) == [
        (tmp_path / "styles" / "ink.safetensors", 0.8),
        (tmp_path / "styles" / "ink.safetensors", 1.0),
    ]
    # the folder is not named: sdkit serve sends this to clients (issue 30's second pass)
    with pytest.raises(InputError, match=r"<lora:missing> in the prompt: no missing.safetensors in the LoRA folder$"):
        prompt_loras("<lora:missing:1>", tmp_path)
    with pytest.raises(InputError, match=r"only old.pt: pickles are refused"):
        prompt_loras("<lora:old:1>", tmp_path)
    with pytest.raises(InputError, match=r"the strength must be a number"):
        prompt_loras("<lora:ink:strong>", tmp_path)


def test_sdxl_pipeline_lora_and_embedding(tiny_families: dict[str, Family]) -> None:
    """SDXL: kohya names in the SGM layout, two text encoders (lora_te1_/lora_te2_), and an
    embedding with clip_l and clip_g, against diffusers' goldens."""
    sdxl = TINY / "sdxl"
    with np.load(sdxl / "adapters.npz", allow_pickle=False) as data:
        goldens = {k: data[k] for k in data.files}
    pipe = sdkit.load_pipeline(sdxl / "sdxl_fp16.safetensors", backend="reference")
    swaps = pipe.set_loras([(sdxl / "lora" / "sdxl_kohya_locon.safetensors", 0.5)])
    assert set(swaps) == {"unet", "text_encoder", "text_encoder_2"}
    feeds = {k.rpartition("/")[2]: v for k, v in goldens.items() if k.startswith("sdxl/inputs/unet/")}
    out = pipe.components["unet"].run(feeds)["out_sample"]
    assert np.abs(out - goldens["lora/sdxl_kohya_locon@0.5/unet/out_sample"]).max() <= TOLERANCE
    pipe.set_loras([])
    pipe.load_embedding(sdxl / "embeddings" / "skxlstyle.safetensors")
    prompt = "a photo of skxlstyle riding a horse"
    for component in ("text_encoder", "text_encoder_2"):
        ids = pipe.text_tokenizers()[component]([prompt])
        assert ids.tolist() == goldens[f"embeddings/{component}/input_ids"].reshape(1, -1).tolist()
        results = pipe.components[component].run({"input_ids": ids})  # the outputs SDXL reads
        assert set(results) == set(pipe.config.text_outputs[component])
        for output, value in results.items():
            assert np.abs(value - goldens[f"embeddings/{component}/{output}"]).max() <= TOLERANCE
