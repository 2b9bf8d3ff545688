"""Full-size FLUX.1 single files load through ``sdkit.load_pipeline`` on the shipped graphs.

The files are header-only copies of the ones users have (``flux1-dev.safetensors`` /
``flux1-schnell.safetensors`` in BFL's layout, bf16, with or without ComfyUI's prefix; ComfyUI's
``clip_l.safetensors`` and ``t5xxl_fp16.safetensors``; BFL's ``ae.safetensors``): real safetensors
headers with every tensor's name, dtype and full-size shape, the data region a sparse hole (36 GB
apparent, nothing written). The tensor lists are ``fixtures/families/flux_full_size_headers.json``
(``make_flux_headers.py``; each certified by diffusers' converters or the transformers module).
Loading reads headers only (``prepare=False``: nothing is compiled, no weight is read).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.testing import write_header_only_safetensors

REPO = Path(__file__).resolve().parents[4]
HEADERS = REPO / "fixtures" / "families" / "flux_full_size_headers.json"
SIDE = {"clip_l": "clip_l.safetensors", "t5xxl": "t5xxl_fp16.safetensors", "vae": "ae.safetensors"}


@lru_cache(maxsize=1)
def headers() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(HEADERS.read_text(encoding="utf-8"))
    return data


def write_header_only(path: Path, file: str, prefix: str = "") -> Path:
    entry = headers()[file]
    shapes = {prefix + key: tuple(shape) for key, shape in entry["tensors"].items()}
    return write_header_only_safetensors(path, shapes, dtype=entry["dtype"])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("flux_full_size")
    out = {name: write_header_only(folder / name, name) for name in headers()}
    out["comfy/flux1-dev.safetensors"] = write_header_only(
        folder / "flux1-dev-comfy.safetensors", "flux1-dev.safetensors", prefix="model.diffusion_model."
    )
    return out


def side(files: dict[str, Path]) -> dict[str, Path]:
    return {flag: files[name] for flag, name in SIDE.items()}


@pytest.mark.parametrize(
    ("file", "family"),
    [
        ("flux1-dev.safetensors", "flux_dev"),
        ("comfy/flux1-dev.safetensors", "flux_dev"),
        ("flux1-schnell.safetensors", "flux_schnell"),
    ],
)
def test_full_size_files_load_and_map_every_component(files: dict[str, Path], file: str, family: str) -> None:
    """Detected, and each component's shipped graph gets every initializer from the files, with
    its shape; no tensor of any file left unread."""
    pipe = sdkit.load_pipeline(files[file], backend="reference", prepare=False, **side(files))
    try:
        mapped = pipe.checkpoint
        assert mapped is not None and mapped.family.name == family
        assert type(pipe).__name__ == "FluxPipeline"
        assert mapped.unknown == ()
        assert set(mapped.weights) == {"text_encoder", "text_encoder_2", "transformer", "vae_decoder", "vae_encoder"}
        counts = {}
        for component, spec in mapped.family.components.items():
            graph = spec.load_graph().proto.graph
            weights = mapped.weights[component]
            assert set(weights) == {t.name for t in graph.initializer}, component
            assert {t.name: tuple(t.dims) for t in graph.initializer} == {n: weights.spec(n)[0] for n in weights}
            counts[component] = len(graph.initializer)
        transformer = 1160 if family == "flux_dev" else 1156
        assert counts == {
            "text_encoder": 196,
            "text_encoder_2": 219,
            "transformer": transformer,
            "vae_decoder": 138,
            "vae_encoder": 106,  # img2img's, from the same ae.safetensors
        }
        assert pipe.config.latent_channels == 16 and pipe.config.vae_scale_factor == 8
    finally:
        pipe.close()


def test_missing_component_file_is_one_clear_error(files: dict[str, Path]) -> None:
    """Without --t5xxl (or any of the three): one ModelFormatError naming what is missing."""
    given = {k: v for k, v in side(files).items() if k != "t5xxl"}
    with pytest.raises(ModelFormatError) as err:
        sdkit.load_pipeline(files["flux1-dev.safetensors"], backend="reference", prepare=False, **given)
    message = str(err.value)
    assert "--t5xxl FILE" in message and "--clip_l" not in message and "--vae" not in message
    with pytest.raises(ModelFormatError, match="--clip_l FILE"):
        sdkit.load_pipeline(files["flux1-schnell.safetensors"], backend="reference", prepare=False)


def test_a_file_in_the_wrong_slot_is_refused(files: dict[str, Path]) -> None:
    """The VAE file given as --t5xxl: the T5 graph's weights are not there, said by name."""
    swapped = {**side(files), "t5xxl": files["ae.safetensors"]}
    with pytest.raises(ModelFormatError, match=r"t5xxl|text_encoder_2"):
        sdkit.load_pipeline(files["flux1-dev.safetensors"], backend="reference", prepare=False, **swapped)


def test_ae_file_fills_the_shipped_vae_encoder(files: dict[str, Path]) -> None:
    """The shipped families read img2img's encoder (``flux_vae_encoder``) from ae.safetensors:
    every initializer with its shape (LDM names, no quant convs), fp32 like the decoder."""
    from sdkit.families import Checkpoint
    from sdkit.families.flux import FLUX_DEV, FLUX_SCHNELL

    for family in (FLUX_DEV, FLUX_SCHNELL):
        encoder = family.components["vae_encoder"]
        assert encoder.graph == "flux_vae_encoder" and "vae_encoder" in family.fp32_components
        file = "flux1-dev.safetensors" if family is FLUX_DEV else "flux1-schnell.safetensors"
        checkpoint = Checkpoint.open(files[file]).with_files(side(files))
        weights = family.map(checkpoint, "bfl").weights["vae_encoder"]
        graph = encoder.load_graph().proto.graph
        assert {t.name: tuple(t.dims) for t in graph.initializer} == {n: weights.spec(n)[0] for n in weights}
        assert len(graph.initializer) == 106


def test_a_vae_file_without_the_encoder_loads_for_txt2img_only(files: dict[str, Path], tmp_path: Path) -> None:
    """A decoder-only VAE file as --vae: the file loads without ``vae_encoder`` (every other
    weight mapped, nothing unread); img2img is one ModelFormatError naming the encoder key it
    lacks, before any model runs (nothing is read from these header-only files)."""
    from PIL import Image

    entry = headers()["ae.safetensors"]
    decoder_only = {k: v for k, v in entry["tensors"].items() if not k.startswith("encoder.")}
    headers()["decoder_only_ae.safetensors"] = {**entry, "tensors": decoder_only}
    try:
        path = write_header_only(tmp_path / "decoder_only_ae.safetensors", "decoder_only_ae.safetensors")
    finally:
        del headers()["decoder_only_ae.safetensors"]
    given = {**side(files), "vae": path}
    pipe = sdkit.load_pipeline(files["flux1-dev.safetensors"], backend="reference", prepare=False, **given)
    try:
        mapped = pipe.checkpoint
        assert mapped is not None and mapped.unknown == ()
        assert set(mapped.weights) == {"text_encoder", "text_encoder_2", "transformer", "vae_decoder"}
        assert mapped.absent == {"vae_encoder": "vae.encoder.conv_in.weight"} and "vae_encoder" not in pipe.components
        with pytest.raises(ModelFormatError) as err:
            pipe.generate("a photo", init_image=Image.new("RGB", (64, 64)), strength=0.5, steps=1)
    finally:
        pipe.close()
    message = str(err.value)
    print(message)
    assert "img2img needs a VAE encoder (vae_encoder)" in message
    assert "decoder-only (no vae.encoder.conv_in.weight)" in message and "(--vae)" in message


def test_a_vae_file_with_part_of_the_encoder_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    """Some encoder tensors but not all: one ModelFormatError counting the encoder's missing weights."""
    entry = headers()["ae.safetensors"]
    partial = {k: v for k, v in entry["tensors"].items() if not k.startswith("encoder.down.")}
    headers()["partial_ae.safetensors"] = {**entry, "tensors": partial}
    try:
        path = write_header_only(tmp_path / "partial_ae.safetensors", "partial_ae.safetensors")
    finally:
        del headers()["partial_ae.safetensors"]
    given = {**side(files), "vae": path}
    with pytest.raises(ModelFormatError) as err:
        sdkit.load_pipeline(files["flux1-dev.safetensors"], backend="reference", prepare=False, **given)
    message = str(err.value)
    print(message)
    missing = sum(k.startswith("encoder.down.") for k in entry["tensors"])
    assert f"weight(s) missing or mis-shaped (the vae_encoder's {missing} of 106)" in message
