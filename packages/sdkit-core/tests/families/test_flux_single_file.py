"""FLUX.1 single files in BFL's layout (``sdkit.families.flux``, ``flux_keys``) on a tiny graph.

Oracle: diffusers' ``FluxTransformer2DModel.from_single_file`` on the same files (its own BFL
converter; ``fixtures/families/make_flux_single_file.py``, goldens in
``fixtures/families/tiny/flux/golden.npz``): the transformer's output on fixed inputs, and the
image ``FluxPipeline`` makes with that transformer and tiny_flow's other components (tiny_flow's
``flux_dev`` / ``flux_schnell`` case), and the image ``FluxImg2ImgPipeline`` makes from tiny_flow's
init image (its ``flux_dev_img2img`` / ``flux_schnell_img2img`` case, the same noise stream).
Required: the images within 1e-3 on [0, 1] pixels on the reference, ggml (threads=1) and openvino
backends; the transformer output within 1e-4.

ComfyUI's scaled-fp8 files (``make_flux_scaled_fp8.py``, ``scaled_fp8_golden.npz``): oracle torch's
dequantized weights (``w8.to(float32) * scale``, required equal bit for bit to the mapped ones)
and diffusers run on them (output 1e-4, image 1e-3 with a scaled-fp8 ``--clip_l`` too).
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
import sdkit.pipelines.loaders.families
import sdkit.pipelines.loaders.single_file
from sdkit.errors import ModelFormatError, OptionError
from sdkit.families import Checkpoint, Family, MappedCheckpoint, describe, detect, load_checkpoint
from sdkit.families.flux import FluxArch, FluxGraphs, flux_family
from sdkit.families.keymaps import TensorSource
from sdkit.model import Model
from sdkit.testing.cli_output import without_progress
from sdkit.testing.goldens import require_backend
from sdkit.testing.safetensors_files import write_header_only_safetensors

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "fixtures" / "families" / "tiny" / "flux"
TINY_FLOW = REPO / "fixtures" / "tiny_flow"
ARCH = FluxArch(hidden=32, in_channels=64, context_dim=16, pooled_dim=32, double_blocks=1, single_blocks=1)


def tiny_graphs(model: str) -> FluxGraphs:
    return FluxGraphs(
        TINY / f"{model}_transformer.onnx",
        TINY / "clip_l.onnx",
        TINY / "t5xxl.onnx",
        TINY / "vae_decoder.onnx",
        2,
        vae_encoder=TINY / "vae_encoder.onnx",
    )


def tiny_family(model: str, guidance: bool) -> Family:
    return flux_family(
        f"tiny_{model}",
        f"tiny {model}",
        tiny_graphs(model),
        ARCH,
        guidance=guidance,
        pipeline="sdkit.pipelines.models.flux:FluxPipeline",
        clip_tokenizer=TINY_FLOW / model / "tokenizer",
    )


DEV, SCHNELL = tiny_family("flux_dev", True), tiny_family("flux_schnell", False)
FAMILIES = [DEV, SCHNELL]
SIDE = {"clip_l": TINY / "clip_l.safetensors", "t5xxl": TINY / "t5xxl.safetensors", "vae": TINY / "ae.safetensors"}
FILES = ("flux_dev_fp16", "flux_dev_bf16_comfy", "flux_schnell_bf16", "flux_dev_fp8_comfy")
IMAGE_TOLERANCE = 1e-3
OUTPUT_TOLERANCE = 1e-4


@lru_cache(maxsize=2)
def info(name: str = "golden") -> dict[str, Any]:
    """``<name>.json`` of the tiny Flux fixtures (``scaled_fp8_golden``: the scaled-fp8 files')."""
    data: dict[str, Any] = json.loads((TINY / f"{name}.json").read_text(encoding="utf-8"))
    return data


def golden(key: str, name: str = "golden") -> np.ndarray:
    with np.load(TINY / f"{name}.npz") as data:
        value: np.ndarray = data[key]
    return value


def case_image(pipe: Any, case: dict[str, Any], **img2img: Any) -> np.ndarray:
    """The golden case's image from ``pipe`` (``img2img``: ``init_image=``, ``strength=``)."""
    image: np.ndarray = pipe.generate(
        "a photo of an astronaut riding a horse on the moon",
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        width=case["width"],
        height=case["height"],
        max_sequence_length=case["max_sequence_length"],
        output_type="np",
        **img2img,
    )
    return image


def mapped(file: str) -> MappedCheckpoint:
    return load_checkpoint(TINY / f"{file}.safetensors", FAMILIES, files=SIDE)


@pytest.fixture
def tiny_flux(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny Flux families registered before the installed ones (as a plugin would add them)."""
    installed = sdkit.pipelines.loaders.families.registered_families()
    monkeypatch.setattr(sdkit.pipelines.loaders.families, "registered_families", lambda: [*FAMILIES, *installed])


@pytest.mark.parametrize("file", FILES)
def test_detected_as_dev_or_schnell_and_every_weight_mapped(file: str) -> None:
    """dev by its guidance embedder, schnell without; every initializer of the graph found, every
    tensor of the file read (no unknown keys), with or without ComfyUI's prefix."""
    checkpoint = Checkpoint.open(TINY / f"{file}.safetensors")
    found = detect(checkpoint, FAMILIES)
    assert found.family is (DEV if "dev" in file else SCHNELL)
    assert found.layout == "bfl" and found.prediction_type == "flow"
    result = found.family.map(checkpoint.with_files(SIDE), found.layout)
    for component, spec in found.family.components.items():
        graph = spec.load_graph()
        assert set(result.weights[component]) == {t.name for t in graph.proto.graph.initializer}
    assert result.unknown == ()
    assert len(checkpoint) == info()["files"][file]["tensors"]


@pytest.mark.parametrize("file", FILES)
def test_transformer_output_is_diffusers_from_single_file(file: str) -> None:
    """The mapped graph's output equals diffusers' ``from_single_file`` model's (reference backend):
    the fused q/k/v and linear1 slices, the swapped final modulation, fp16/bf16/fp8 upcasts."""
    model = Model(DEV.components["transformer"].load_graph() if "dev" in file else _schnell_graph(), _weights(file))
    feeds = {k.rpartition("/")[2]: golden(k) for k in _input_keys(file)}
    compiled = sdkit.compile(model, backend="reference")
    out = compiled.run(feeds)["out_hidden_states"]
    diff = float(np.abs(out - golden(f"{file}/output")).max())
    print(f"{file}: transformer max |diff| {diff:.3g}")
    assert diff <= OUTPUT_TOLERANCE


def _schnell_graph() -> Any:
    return SCHNELL.components["transformer"].load_graph()


def _weights(file: str) -> Any:
    return mapped(file).weights["transformer"]


def _input_keys(file: str) -> list[str]:
    with np.load(TINY / "golden.npz") as data:
        return [k for k in data.files if k.startswith(f"{file}/inputs/")]


IMAGE_CASES = [
    *[
        pytest.param("reference", f, id=f"reference-{f}")
        for f in ("flux_dev_fp16", "flux_dev_bf16_comfy", "flux_schnell_bf16")
    ],
    *[pytest.param(b, "flux_dev_bf16_comfy", id=f"{b}-flux_dev_bf16_comfy") for b in ("ggml", "openvino")],
    *[pytest.param(b, "flux_schnell_bf16", id=f"{b}-flux_schnell_bf16") for b in ("ggml", "openvino")],
]


@pytest.mark.parametrize(("backend", "file"), IMAGE_CASES)
def test_image_equals_diffusers_from_the_single_files(tiny_flux: None, backend: str, file: str) -> None:
    """``load_pipeline(transformer file, clip_l=, t5xxl=, vae=)`` makes the image diffusers'
    ``FluxPipeline`` makes with ``from_single_file``'s transformer and the same CLIP, T5 and VAE."""
    require_backend(backend)
    case = info()["files"][file]["case"]
    pipe = sdkit.load_pipeline(TINY / f"{file}.safetensors", backend=backend, threads=1, **SIDE)
    try:
        assert pipe.checkpoint is not None and pipe.checkpoint.family.name == f"tiny_{info()['files'][file]['model']}"
        image = case_image(pipe, case)
        assert set(pipe.backends().values()) - {None} == {backend}  # the encoder: img2img only
    finally:
        pipe.close()
    diff = float(np.abs(image - golden(f"{file}/image")).max())
    print(f"{file} on {backend}: image max |diff| {diff:.3g}")
    assert diff <= IMAGE_TOLERANCE


@pytest.mark.parametrize(("backend", "file"), IMAGE_CASES)
def test_img2img_equals_diffusers_from_the_single_files(tiny_flux: None, backend: str, file: str) -> None:
    """img2img from the single files (the encoder read from ae.safetensors): the image diffusers'
    ``FluxImg2ImgPipeline`` makes with ``from_single_file``'s transformer, the same CLIP, T5 and
    VAE, the same init image, strength and noise stream."""
    from PIL import Image

    require_backend(backend)
    case = info()["files"][file]["img2img_case"]
    pipe = sdkit.load_pipeline(TINY / f"{file}.safetensors", backend=backend, threads=1, **SIDE)
    try:
        image = case_image(
            pipe, case, init_image=Image.fromarray(golden("img2img_init_image")), strength=case["strength"]
        )
        assert set(pipe.backends().values()) == {backend}
    finally:
        pipe.close()
    diff = float(np.abs(image - golden(f"{file}/img2img_image")).max())
    txt2img = float(np.abs(image - golden(f"{file}/image")).max())
    print(f"{file} img2img on {backend}: image max |diff| {diff:.3g} (vs the txt2img golden {txt2img:.3g})")
    assert diff <= IMAGE_TOLERANCE < txt2img


def test_set_vae_takes_both_halves_from_the_vae_file(tiny_flux: None, tmp_path: Path) -> None:
    """``set_vae`` gives the encoder and the decoder from the one file (A1111, ComfyUI): loaded
    with a decoder-only ``--vae``, ``set_vae(ae.safetensors)`` adds the encoder and img2img makes
    diffusers' img2img image; ``set_vae(decoder-only file)`` releases the encoder (no compiled
    encoder left alive), txt2img still makes diffusers' image and img2img names the key it lacks."""
    import gc
    import weakref

    from PIL import Image

    file = "flux_dev_bf16_comfy"
    checkpoint = Checkpoint.open(SIDE["vae"])
    tensors = {k: checkpoint.files[0].read(checkpoint.entry(k)) for k in checkpoint}
    decoder_only = tmp_path / "decoder_only_ae.safetensors"
    save_file({k: v for k, v in tensors.items() if not k.startswith("encoder.")}, str(decoder_only))

    def image(img2img: bool) -> np.ndarray:
        case = info()["files"][file]["img2img_case" if img2img else "case"]
        keys = ("seed", "steps", "guidance_scale", "width", "height", "max_sequence_length")
        options: dict[str, Any] = {k: case[k] for k in keys}
        if img2img:
            options.update(init_image=Image.fromarray(golden("img2img_init_image")), strength=case["strength"])
        prompt = "a photo of an astronaut riding a horse on the moon"
        return np.asarray(pipe.generate(prompt, **options, output_type="np"))

    pipe = sdkit.load_pipeline(
        TINY / f"{file}.safetensors", backend="reference", threads=1, **{**SIDE, "vae": decoder_only}
    )
    try:
        assert "vae_encoder" not in pipe.components
        pipe.set_vae(SIDE["vae"])
        diff = float(np.abs(image(True) - golden(f"{file}/img2img_image")).max())
        print(f"decoder-only --vae, set_vae(ae.safetensors): img2img max |diff| {diff:.3g}")
        assert diff <= IMAGE_TOLERANCE and pipe.backends()["vae_encoder"] == "reference"
        compiled = weakref.ref(pipe.components["vae_encoder"].compiled)
        pipe.set_vae(decoder_only)
        gc.collect()
        assert "vae_encoder" not in pipe.components and compiled() is None
        diff = float(np.abs(image(False) - golden(f"{file}/image")).max())
        print(f"set_vae(decoder_only_ae.safetensors): txt2img max |diff| {diff:.3g}")
        assert diff <= IMAGE_TOLERANCE
        with pytest.raises(
            ModelFormatError, match=r"decoder_only_ae.safetensors, is decoder-only \(no encoder.conv_in.weight\)"
        ):
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
    finally:
        pipe.close()


def test_missing_component_files_are_named(tiny_flux: None) -> None:
    """A transformer-only file without its CLIP-L / T5-XXL / VAE files: one error naming the flags;
    a component file for a family that takes none: refused."""
    with pytest.raises(ModelFormatError) as err:
        sdkit.load_pipeline(TINY / "flux_dev_fp16.safetensors", t5xxl=SIDE["t5xxl"])
    message = str(err.value)
    assert "--clip_l FILE" in message and "--vae FILE" in message and "--t5xxl" not in message
    assert "clip_l=PATH, vae=PATH" in message
    with pytest.raises(ModelFormatError, match="vae file not found"):
        sdkit.load_pipeline(TINY / "flux_dev_fp16.safetensors", **{**SIDE, "vae": TINY / "nothing.safetensors"})


def test_set_checkpoint_keeps_the_component_files(tiny_flux: None) -> None:
    """Another transformer file of the family swaps only the transformer's weights (reference)."""
    pipe = sdkit.load_pipeline(TINY / "flux_dev_fp16.safetensors", backend="reference", prepare=False, **SIDE)
    try:
        swaps = pipe.set_checkpoint(TINY / "flux_dev_bf16_comfy.safetensors")
        assert pipe.checkpoint is not None and pipe.checkpoint.checkpoint.path.name == "flux_dev_bf16_comfy.safetensors"
        assert set(swaps) == {"text_encoder", "text_encoder_2", "transformer", "vae_decoder", "vae_encoder"}
    finally:
        pipe.close()


def test_a_renamed_or_missing_key_is_named(tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(TINY / "flux_dev_fp16.safetensors")
    tensors = {k: checkpoint.files[0].read(checkpoint.entry(k)) for k in checkpoint}
    tensors["double_blocks.0.img_attn.qkv_renamed.weight"] = tensors.pop("double_blocks.0.img_attn.qkv.weight")
    path = tmp_path / "renamed.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelFormatError) as err:
        DEV.map(Checkpoint.open(path).with_files(SIDE), "bfl")
    assert "double_blocks.0.img_attn.qkv.weight (missing)" in str(err.value)
    assert "qkv_renamed" in str(err.value)


@pytest.mark.parametrize(
    ("extra", "metadata", "named"),
    [
        ({"double_blocks.0.img_mlp.0.comfy_quant": np.zeros(8, np.uint8)}, None, "tensor '.*comfy_quant'"),
        ({}, {"_quantization_metadata": "{}"}, "_quantization_metadata"),
    ],
)
def test_comfyui_quantized_files_are_refused_by_name(
    tmp_path: Path, extra: dict[str, np.ndarray], metadata: dict[str, str] | None, named: str
) -> None:
    """ComfyUI's newer quantized files (per-layer int8/fp8/nvfp4 formats) are one error naming
    the format, as the file itself or as a component file, never weights loaded unscaled."""
    path = tmp_path / "flux1-dev-fp8mixed.safetensors"
    save_file({**_raw(TINY / "flux_dev_fp8_comfy.safetensors"), **extra}, str(path), metadata=metadata)
    with pytest.raises(ModelFormatError, match=rf"flux1-dev-fp8mixed.safetensors is a ComfyUI quantized .*{named}"):
        load_checkpoint(path, FAMILIES, files=SIDE)
    t5 = tmp_path / "t5xxl_fp8mixed.safetensors"
    save_file({**_raw(SIDE["t5xxl"]), **extra}, str(t5), metadata=metadata)
    with pytest.raises(ModelFormatError, match=r"t5xxl_fp8mixed.safetensors is a ComfyUI quantized checkpoint"):
        load_checkpoint(TINY / "flux_dev_fp16.safetensors", FAMILIES, files={**SIDE, "t5xxl": t5})


def _raw(path: Path) -> dict[str, np.ndarray]:
    checkpoint = Checkpoint.open(path)
    return {k: checkpoint.files[0].read(checkpoint.entry(k)) for k in checkpoint}


def test_fp8_e4m3_bytes_upcast_exactly() -> None:
    """Every float8_e4m3fn byte against its definition (bias 7, subnormals, NaN, no infinity)."""
    from sdkit.families.safetensors_reader import FP8_VALUES

    table = FP8_VALUES["F8_E4M3"]
    assert table[0x38] == 1.0 and table[0x40] == 2.0 and table[0xB8] == -1.0
    assert table[0x7E] == 448.0 and table[0x01] == 2.0**-9 and table[0x08] == 2.0**-6
    assert np.isnan(table[0x7F]) and np.isnan(table[0xFF]) and np.isfinite(table[:0x7F]).all()
    e5m2 = FP8_VALUES["F8_E5M2"]
    assert e5m2[0x3C] == 1.0 and np.isinf(e5m2[0x7C])


def bfl_header(path: Path, guidance: bool, prefix: str = "", dtype: str = "BF16") -> None:
    """A full-width (3072), depth-1 FLUX.1 file in BFL's layout, header only: the data region is a
    sparse hole (detection and mapping read headers; nothing here reads data). The key list is
    BFL's ``flux`` module tree (``fixtures/families/flux_full_size_check.py`` checks the full
    780-key one against diffusers' converter)."""
    h, t, mlp = 3072, 256, 4 * 3072
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out, inp), (out,)

    linear("img_in", h, 64)
    linear("txt_in", h, 4096)
    for embedder, width in (("time_in", t), ("vector_in", 768), *((("guidance_in", t),) if guidance else ())):
        linear(f"{embedder}.in_layer", h, width)
        linear(f"{embedder}.out_layer", h, h)
    for side in ("img", "txt"):
        block = f"double_blocks.0.{side}"
        linear(f"{block}_mod.lin", 6 * h, h)
        linear(f"{block}_attn.qkv", 3 * h, h)
        linear(f"{block}_attn.proj", h, h)
        linear(f"{block}_mlp.0", mlp, h)
        linear(f"{block}_mlp.2", h, mlp)
        shapes[f"{block}_attn.norm.query_norm.scale"] = shapes[f"{block}_attn.norm.key_norm.scale"] = (128,)
    linear("single_blocks.0.linear1", 3 * h + mlp, h)
    linear("single_blocks.0.linear2", h, h + mlp)
    linear("single_blocks.0.modulation.lin", 3 * h, h)
    shapes["single_blocks.0.norm.query_norm.scale"] = shapes["single_blocks.0.norm.key_norm.scale"] = (128,)
    linear("final_layer.linear", 64, h)
    linear("final_layer.adaLN_modulation.1", 2 * h, h)
    matrices = {prefix + key: dtype for key, shape in shapes.items() if len(shape) == 2}  # vectors stay BF16
    write_header_only_safetensors(path, {prefix + key: shape for key, shape in shapes.items()}, "BF16", matrices)


@pytest.mark.parametrize(
    ("guidance", "prefix", "dtype", "family"),
    [
        (True, "", "BF16", "flux_dev"),
        (True, "model.diffusion_model.", "F8_E4M3", "flux_dev"),
        (False, "", "F16", "flux_schnell"),
    ],
)
def test_full_width_files_are_flux_dev_or_schnell(
    tmp_path: Path, guidance: bool, prefix: str, dtype: str, family: str
) -> None:
    """The registered full-size families tell dev (``guidance_in``) from schnell from a header;
    ``sdkit inspect`` names them; ``load_pipeline`` of a transformer-only file without its
    component files names the flags (``test_flux_full_size_load.py`` loads full files with them)."""
    path = tmp_path / "flux1.safetensors"
    bfl_header(path, guidance, prefix, dtype)
    checkpoint = Checkpoint.open(path)
    families = sdkit.pipelines.loaders.families.registered_families()
    assert detect(checkpoint, families).family.name == family
    text = "\n".join(describe(checkpoint, families).lines())
    assert ("FLUX.1 dev" if guidance else "FLUX.1 schnell") in text
    assert "BFL original" in text and ("fp8_e4m3" in text if dtype.startswith("F8") else dtype.lower() in text)
    with pytest.raises(ModelFormatError, match="--clip_l FILE"):
        sdkit.load_pipeline(path)


def test_image_goldens_move_with_the_file_dtype() -> None:
    """The image goldens are sensitive to what they check: the bf16 files' images differ from the
    fp32 weights' (tiny_flow's golden) by more than the tolerance."""
    with np.load(TINY_FLOW / "golden.npz") as data:
        fp32 = {k: data[f"{k}/image"] for k in ("flux_dev", "flux_schnell")}
    for file, case in (("flux_dev_bf16_comfy", "flux_dev"), ("flux_schnell_bf16", "flux_schnell")):
        assert float(np.abs(golden(f"{file}/image") - fp32[case]).max()) > IMAGE_TOLERANCE


def test_command_line_takes_the_component_files(
    tiny_flux: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sdkit generate --diffusion-model flux.safetensors --clip_l ... --t5xxl ... --vae ...``
    (as stable-diffusion.cpp; ``--model`` alike): the PNG holds diffusers' image (8-bit); without them, one line naming
    the flags."""
    from PIL import Image

    from sdkit.cli.main import main

    require_backend("ggml")
    out = tmp_path / "flux.png"
    model = TINY / "flux_dev_bf16_comfy.safetensors"
    argv = ["generate", "a photo of an astronaut riding a horse on the moon", "--model", str(model), "-o", str(out)]
    argv += ["--backend", "ggml", "--threads", "1", "--steps", "3", "--seed", "11", "--cfg", "3.5"]
    argv += ["--width", "48", "--height", "32", "--max-sequence-length", "32"]
    files = ["--clip_l", str(SIDE["clip_l"]), "--t5xxl", str(SIDE["t5xxl"]), "--vae", str(SIDE["vae"])]
    # stable-diffusion.cpp's spelling of the transformer file's flag: --diffusion-model
    assert main([*argv[:2], "--diffusion-model", *argv[3:], *files]) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
    assert np.abs(pixels - golden("flux_dev_bf16_comfy/image")[0]).max() <= 1 / 255 + IMAGE_TOLERANCE
    capsys.readouterr()
    assert main([*argv, "--force"]) == 1  # --force: the same -o again, so the missing files are the error
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("sdkit: error: ") and "--clip_l FILE" in err and err.count("\n") == 1


def test_component_files_are_refused_where_nothing_takes_them(tiny_families: Any) -> None:
    """``clip_l=`` for an ONNX folder, ``vae=`` at load for an SD checkpoint: one OptionError."""
    with pytest.raises(OptionError, match="clip_l= is for a single-file model"):
        sdkit.load_pipeline(TINY_FLOW / "flux_dev", clip_l=SIDE["clip_l"])
    sd1 = REPO / "fixtures" / "families" / "tiny" / "sd1" / "sd1_fp16.safetensors"
    if sd1.is_file():
        with pytest.raises(OptionError, match="vae not used"):
            sdkit.load_pipeline(sd1, vae=SIDE["vae"])


def test_command_line_img2img_from_the_single_files(tiny_flux: None, tmp_path: Path) -> None:
    """``sdkit generate --diffusion-model ... --vae ae.safetensors --init-image F --strength 0.6``:
    the PNG holds diffusers' ``FluxImg2ImgPipeline`` image (8-bit), the size the init image's."""
    from PIL import Image

    from sdkit.cli.main import main

    require_backend("ggml")
    init, out = tmp_path / "init.png", tmp_path / "flux_img2img.png"
    Image.fromarray(golden("img2img_init_image")).save(init)
    case = info()["files"]["flux_dev_bf16_comfy"]["img2img_case"]
    model = TINY / "flux_dev_bf16_comfy.safetensors"
    argv = ["generate", "a photo of an astronaut riding a horse on the moon", "--diffusion-model", str(model)]
    argv += ["-o", str(out), "--backend", "ggml", "--threads", "1", "--steps", str(case["steps"]), "--seed", "11"]
    argv += ["--cfg", "3.5", "--max-sequence-length", "32", "--init-image", str(init), "--strength", "0.6"]
    argv += ["--clip_l", str(SIDE["clip_l"]), "--t5xxl", str(SIDE["t5xxl"]), "--vae", str(SIDE["vae"])]
    assert main(argv) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
        assert "Denoising strength: 0.6" in image.info["parameters"]
    assert np.abs(pixels - golden("flux_dev_bf16_comfy/img2img_image")[0]).max() <= 1 / 255 + IMAGE_TOLERANCE


# ComfyUI's scaled fp8 files (``make_flux_scaled_fp8.py``): each fp8 weight read as
# ``weight * scale_weight``; oracle: torch's dequantized weights and diffusers run on them
# (``scaled_fp8_golden.npz``). Mapped weights exact, output 1e-4, image 1e-3.
SCALED_FILES = ("flux_dev_fp8_scaled", "flux_dev_fp8_scaled_rows")
COMFY = "model.diffusion_model."
SCALED_SIDE = {**SIDE, "clip_l": TINY / "clip_l_fp8_scaled.safetensors"}
HIDDEN = 32


SCALED = "scaled_fp8_golden"


@pytest.mark.parametrize("file", SCALED_FILES)
def test_stored_weights_read_as_torch_dequantizes_them(file: str) -> None:
    """Each fp8 matrix read through its ``scale_weight`` (per tensor, or per output channel) is
    torch's ``w8.to(float32) * scale``, bit for bit; the scales and the marker are consumed."""
    checkpoint = Checkpoint.open(TINY / f"{file}.safetensors")
    assert not [k for k in checkpoint if k.endswith((".scale_weight", ".scale_input", "scaled_fp8"))]
    assert len(checkpoint) == 52  # the tensors of the plain fp8 file
    for key in ("double_blocks.0.img_attn.qkv.weight", "single_blocks.0.linear1.weight", "img_in.weight"):
        expected = golden(f"{file}/dequantized/{key}", SCALED)
        assert checkpoint.entry(COMFY + key).dtype == "F8_E4M3" and checkpoint.scale(COMFY + key) is not None
        read = checkpoint.tensor(COMFY + key, TensorSource((COMFY + key,)), expected.shape).load()
        np.testing.assert_array_equal(read, expected)
    # ``sdkit inspect`` counts the scaled weights apart: as many as the file's scale_weight tensors
    header = (TINY / f"{file}.safetensors").read_bytes()
    keys = json.loads(header[8 : 8 + int.from_bytes(header[:8], "little")])
    scaled = sum(1 for k in keys if k.endswith(".scale_weight"))
    dtypes = dict(describe(checkpoint, FAMILIES).details)["dtype"]
    assert f"fp8_e4m3 scaled x{scaled}" in dtypes and scaled > 0, dtypes


@pytest.mark.parametrize("file", SCALED_FILES)
def test_mapped_rows_take_their_own_scale(file: str) -> None:
    """The fused q/k/v and linear1 rows, the transposed-halves final modulation: each mapped
    diffusers weight is its rows of torch's dequantized tensor (per-channel scales: the same rows)."""
    weights = load_checkpoint(TINY / f"{file}.safetensors", FAMILIES, files=SIDE).weights["transformer"]
    qkv = golden(f"{file}/dequantized/double_blocks.0.img_attn.qkv.weight", SCALED)
    linear1 = golden(f"{file}/dequantized/single_blocks.0.linear1.weight", SCALED)
    modulation = golden(f"{file}/dequantized/final_layer.adaLN_modulation.1.weight", SCALED)
    expected = {
        "transformer_blocks.0.attn.to_q.weight": qkv[:HIDDEN],
        "transformer_blocks.0.attn.to_k.weight": qkv[HIDDEN : 2 * HIDDEN],
        "transformer_blocks.0.attn.to_v.weight": qkv[2 * HIDDEN :],
        "single_transformer_blocks.0.attn.to_v.weight": linear1[2 * HIDDEN : 3 * HIDDEN],
        "single_transformer_blocks.0.proj_mlp.weight": linear1[3 * HIDDEN :],
        "norm_out.linear.weight": np.concatenate([modulation[HIDDEN:], modulation[:HIDDEN]]),
    }
    for name, value in expected.items():
        np.testing.assert_array_equal(np.asarray(weights[name]), value, err_msg=name)


@pytest.mark.parametrize("file", SCALED_FILES)
def test_transformer_output_is_diffusers_on_the_dequantized_weights(file: str) -> None:
    """No unused-key warning for the scales; the graph's output equals diffusers' (reference)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = load_checkpoint(TINY / f"{file}.safetensors", FAMILIES, files=SIDE)
    assert result.unknown == ()
    model = Model(DEV.components["transformer"].load_graph(), result.weights["transformer"])
    with np.load(TINY / "scaled_fp8_golden.npz") as data:
        feeds = {k.rpartition("/")[2]: data[k] for k in data.files if k.startswith(f"{file}/inputs/")}
    out = sdkit.compile(model, backend="reference").run(feeds)["out_hidden_states"]
    diff = float(np.abs(out - golden(f"{file}/output", SCALED)).max())
    print(f"{file}: transformer max |diff| {diff:.3g}")
    assert diff <= OUTPUT_TOLERANCE


def test_component_file_reads_as_torch_dequantizes_it() -> None:
    """A scaled-fp8 text-encoder file (``--clip_l``) under its ``clip_l.`` prefix."""
    checkpoint = Checkpoint.open(TINY / "flux_dev_fp16.safetensors").with_files(SCALED_SIDE)
    assert not [k for k in checkpoint if k.endswith((".scale_weight", ".scale_input", "scaled_fp8"))]
    for key in ("text_model.encoder.layers.0.self_attn.q_proj.weight", "text_model.encoder.layers.0.mlp.fc1.weight"):
        expected = golden(f"clip_l_fp8_scaled/dequantized/{key}", SCALED)
        read = checkpoint.tensor(f"clip_l.{key}", TensorSource((f"clip_l.{key}",)), expected.shape).load()
        np.testing.assert_array_equal(read, expected)


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_image_equals_diffusers_from_the_dequantized_files(tiny_flux: None, backend: str) -> None:
    """``load_pipeline(scaled transformer file, clip_l=scaled CLIP-L file, t5xxl=, vae=)`` makes the
    image diffusers' ``FluxPipeline`` makes with torch's dequantized transformer and CLIP-L."""
    require_backend(backend)
    file = "flux_dev_fp8_scaled"
    case = info(SCALED)["files"][file]["case"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe = sdkit.load_pipeline(TINY / f"{file}.safetensors", backend=backend, threads=1, **SCALED_SIDE)
    try:
        image = case_image(pipe, case)
    finally:
        pipe.close()
    diff = float(np.abs(image - golden(f"{file}/image", SCALED)).max())
    print(f"{file} + clip_l_fp8_scaled on {backend}: image max |diff| {diff:.3g}")
    assert diff <= IMAGE_TOLERANCE


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"double_blocks.0.img_attn.qkv.scale_weight": np.ones(5, np.float32)}, r"has shape \[5\]: a scale is one"),
        ({"double_blocks.0.img_attn.qkv.scale_weight": np.ones((96, 2), np.float32)}, r"has shape \[96, 2\]"),
        ({"double_blocks.0.nothing.scale_weight": np.ones((), np.float32)}, "has no weight beside it"),
        ({"img_in.scale_weight": np.ones((), np.int32)}, "is I32, not a float"),
    ],
)
def test_a_malformed_scale_is_one_error(tmp_path: Path, change: dict[str, np.ndarray], named: str) -> None:
    path = tmp_path / "bad_scaled.safetensors"
    tensors = {**_raw(TINY / "flux_dev_fp8_scaled.safetensors"), **{COMFY + k: v for k, v in change.items()}}
    save_file(tensors, str(path))
    with pytest.raises(ModelFormatError, match=rf"bad_scaled.safetensors: the scaled fp8 tensor '{COMFY}.*' {named}"):
        load_checkpoint(path, FAMILIES, files=SIDE)
