"""SD3 / SD 3.5 and Chroma single files in their original layouts (``sdkit.families.sd3``,
``sd3_keys``, ``chroma``) on tiny graphs.

Oracle: diffusers reading the same files with its own converters
(``fixtures/families/make_sd3_chroma_single_file.py``, goldens in
``fixtures/families/tiny/{sd3,chroma}/golden.npz``): ``StableDiffusion3Pipeline.from_single_file``
for Stability's all-in-one file, ``SD3Transformer2DModel`` / ``ChromaTransformer2DModel``
``.from_single_file`` for the transformer files; the images diffusers' pipelines make with what it
loaded, tiny_flow's ``sd3_cfg`` / ``chroma_cfg`` case, and the image
``StableDiffusion3Img2ImgPipeline`` / ``ChromaImg2ImgPipeline`` makes with them from tiny_flow's
init image (its ``sd3_img2img`` / ``chroma_img2img`` case, the same noise stream). Required: the
images within 1e-3 on [0, 1] pixels on the reference, ggml (threads=1) and openvino backends; the
transformer output within 1e-4. T5 and the VAE are the tiny Flux files (the same modules).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
import sdkit.pipelines.loaders.families
from sdkit.errors import ModelFormatError
from sdkit.families import Checkpoint, CheckpointTensor, Family, MappedCheckpoint, describe, detect, load_checkpoint
from sdkit.families.chroma import ChromaArch, chroma_family
from sdkit.families.family import initializer_specs
from sdkit.families.flux import FluxGraphs
from sdkit.families.sd3 import Sd3Arch, Sd3Graphs, sd3_family
from sdkit.model import Model
from sdkit.testing import write_header_only_safetensors
from sdkit.testing.cli_output import without_progress
from sdkit.testing.goldens import require_backend

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "fixtures" / "families" / "tiny"
TINY_SD3, TINY_CHROMA, TINY_FLUX = TINY / "sd3", TINY / "chroma", TINY / "flux"
TINY_FLOW = REPO / "fixtures" / "tiny_flow"
SD3_ARCH = Sd3Arch(
    hidden=32,
    depth=2,
    context_dim=16,
    pooled_dim=16,
    positions=32 * 32,
    dual_attention_layers=(0,),
    qk_norm=True,
    head_dim=8,
    clip_l_layers=5,
    clip_g_layers=5,
)
CHROMA_ARCH = ChromaArch(
    hidden=32,
    context_dim=16,
    approximator_channels=16,
    approximator_hidden=32,
    approximator_layers=1,
    double_blocks=1,
    single_blocks=1,
)
SD3 = sd3_family(
    "tiny_sd3",
    "tiny SD3",
    Sd3Graphs(
        TINY_SD3 / "sd3_transformer.onnx",
        TINY_SD3 / "clip_l.onnx",
        TINY_SD3 / "clip_g.onnx",
        TINY_FLUX / "t5xxl.onnx",
        TINY_FLUX / "vae_decoder.onnx",
        2,
        TINY_FLUX / "vae_encoder.onnx",
    ),
    SD3_ARCH,
    pipeline="sdkit.pipelines.models.sd3:StableDiffusion3Pipeline",
    clip_tokenizers=(TINY_FLOW / "sd3" / "tokenizer", TINY_FLOW / "sd3" / "tokenizer_2"),
)
CHROMA: Family = chroma_family(
    "tiny_chroma",
    "tiny Chroma",
    FluxGraphs(
        TINY_CHROMA / "chroma_transformer.onnx",
        t5=TINY_FLUX / "t5xxl.onnx",
        vae_decoder=TINY_FLUX / "vae_decoder.onnx",
        vae_blocks=2,
        vae_encoder=TINY_FLUX / "vae_encoder.onnx",
    ),
    CHROMA_ARCH,
    pipeline="sdkit.pipelines.models.chroma:ChromaPipeline",
)
FAMILIES = [SD3, CHROMA]
T5, AE = TINY_FLUX / "t5xxl.safetensors", TINY_FLUX / "ae.safetensors"
SIDE: dict[str, dict[str, Path]] = {
    "sd3_incl_clips_fp16": {"t5xxl": T5},
    "sd35_transformer_bf16": {
        "clip_l": TINY_SD3 / "clip_l.safetensors",
        "clip_g": TINY_SD3 / "clip_g.safetensors",
        "t5xxl": T5,
        "vae": AE,
    },
    "chroma_bf16": {"t5xxl": T5, "vae": AE},
    "chroma_fp16_comfy": {"t5xxl": T5, "vae": AE},
}
FILES = tuple(SIDE)
IMAGE_TOLERANCE = 1e-3
OUTPUT_TOLERANCE = 1e-4


def folder(file: str) -> Path:
    return TINY_CHROMA if file.startswith("chroma") else TINY_SD3


def family_of(file: str) -> Family:
    return CHROMA if file.startswith("chroma") else SD3


@lru_cache(maxsize=2)
def info(where: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((where / "golden.json").read_text(encoding="utf-8"))
    return data


def golden(file: str, key: str, top: bool = False) -> np.ndarray:
    """``<file>/<key>`` of the file's golden.npz (``top``: ``key`` itself, e.g. the init image)."""
    with np.load(folder(file) / "golden.npz") as data:
        value: np.ndarray = data[key if top else f"{file}/{key}"]
    return value


def mapped(file: str) -> MappedCheckpoint:
    return load_checkpoint(folder(file) / f"{file}.safetensors", FAMILIES, files=SIDE[file])


@pytest.fixture
def tiny_families(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny SD3 and Chroma families registered before the installed ones (as a plugin would)."""
    installed = sdkit.pipelines.loaders.families.registered_families()
    monkeypatch.setattr(sdkit.pipelines.loaders.families, "registered_families", lambda: [*FAMILIES, *installed])


@pytest.mark.parametrize("file", FILES)
def test_detected_and_every_weight_mapped(file: str) -> None:
    """The file is its family (``sai`` / ``bfl`` layout); every initializer of every graph is
    found with its shape, every tensor of the file and of the component files is read (SD3
    CLIP-L's ``text_projection``, unused by SD3, is skipped by name), with or without prefixes."""
    checkpoint = Checkpoint.open(folder(file) / f"{file}.safetensors")
    found = detect(checkpoint, FAMILIES)
    assert found.family is family_of(file)
    assert found.layout == ("bfl" if file.startswith("chroma") else "sai") and found.prediction_type == "flow"
    result = mapped(file)
    for component, spec in found.family.components.items():
        graph = spec.load_graph()
        assert set(result.weights[component]) == {t.name for t in graph.proto.graph.initializer}
    assert result.unknown == ()
    assert len(checkpoint) == info(folder(file))["files"][file]["tensors"]


def test_all_in_one_reads_its_own_encoders_and_vae() -> None:
    """Stability's all-in-one file: CLIP-L, bigG and the VAE from the file itself (only T5 given)."""
    result = mapped("sd3_incl_clips_fp16")
    for component in ("text_encoder", "text_encoder_2", "transformer", "vae_decoder", "vae_encoder"):
        assert read_from(result, component) == {"sd3_incl_clips_fp16.safetensors"}, component
    assert read_from(result, "text_encoder_3") == {"t5xxl.safetensors"}


def read_from(result: MappedCheckpoint, component: str) -> set[str]:
    """The files a component's lazy weights are read from."""
    entries = result.weights[component].entries().values()
    return {Path(t.file.path).name for t in entries if isinstance(t, CheckpointTensor)}


def test_a_given_component_file_replaces_the_one_in_the_checkpoint(recwarn: pytest.WarningsRecorder) -> None:
    """``clip_g=`` with an all-in-one file: bigG comes from that file, the checkpoint's own copy is
    neither read nor reported as unread."""
    path = TINY_SD3 / "sd3_incl_clips_fp16.safetensors"
    result = load_checkpoint(path, FAMILIES, files={"t5xxl": T5, "clip_g": TINY_SD3 / "clip_g.safetensors"})
    assert read_from(result, "text_encoder_2") == {"clip_g.safetensors"}
    assert result.unknown == () and not [w for w in recwarn if "no tiny SD3 component reads" in str(w.message)]


@pytest.mark.parametrize("file", FILES)
def test_transformer_output_is_diffusers_from_single_file(file: str) -> None:
    """The mapped graph's output equals the transformer diffusers loaded from the file (reference
    backend): fused q/k/v and linear1 slices, swapped modulations, the approximator's names."""
    family = family_of(file)
    model = Model(family.components["transformer"].load_graph(), mapped(file).weights["transformer"])
    with np.load(folder(file) / "golden.npz") as data:
        feeds = {k.rpartition("/")[2]: data[k] for k in data.files if k.startswith(f"{file}/inputs/")}
    out = sdkit.compile(model, backend="reference").run(feeds)["out_hidden_states"]
    diff = float(np.abs(out - golden(file, "output")).max())
    print(f"{file}: transformer max |diff| {diff:.3g}")
    assert diff <= OUTPUT_TOLERANCE


IMAGE_CASES = [
    *[pytest.param("reference", f, id=f"reference-{f}") for f in FILES],
    *[
        pytest.param(b, f, id=f"{b}-{f}")
        for b in ("ggml", "openvino")
        for f in ("sd3_incl_clips_fp16", "sd35_transformer_bf16", "chroma_bf16")
    ],
]


def generate(path: Path, backend: str, case: dict[str, Any], files: dict[str, Path], **img2img: Any) -> np.ndarray:
    """The case's image (``img2img``: ``init_image=``, ``strength=``)."""
    pipe = sdkit.load_pipeline(path, backend=backend, threads=1, **files)
    try:
        image = pipe.generate(
            "a photo of an astronaut riding a horse on the moon",
            negative_prompt=case["negative_prompt"],
            seed=case["seed"],
            steps=case["steps"],
            guidance_scale=case["guidance_scale"],
            width=case["width"],
            height=case["height"],
            max_sequence_length=case["max_sequence_length"],
            output_type="np",
            **img2img,
        )
        ran = set(pipe.backends().values())
        assert (ran if img2img else ran - {None}) == {backend}  # the encoder runs for img2img only
    finally:
        pipe.close()
    return np.asarray(image)


@pytest.mark.parametrize(("backend", "file"), IMAGE_CASES)
def test_image_equals_diffusers_from_the_single_files(tiny_families: None, backend: str, file: str) -> None:
    """``load_pipeline(file, <its component files>)`` makes the image diffusers' pipeline makes
    with what diffusers loaded from the same files."""
    require_backend(backend)
    case = info(folder(file))["files"][file]["case"]
    image = generate(folder(file) / f"{file}.safetensors", backend, case, SIDE[file])
    diff = float(np.abs(image - golden(file, "image")).max())
    print(f"{file} on {backend}: image max |diff| {diff:.3g}")
    assert diff <= IMAGE_TOLERANCE


def _raw(path: Path) -> dict[str, np.ndarray]:
    checkpoint = Checkpoint.open(path)
    return {k: checkpoint.files[0].read(checkpoint.entry(k)) for k in checkpoint}


def test_an_all_in_one_file_with_t5_needs_no_component_file(tiny_families: None, tmp_path: Path) -> None:
    """``sd3_medium_incl_clips_t5xxlfp16``'s layout: T5 under ``text_encoders.t5xxl.transformer.``
    (the tied embedding under both its names). Loads with no component file; its image is the
    all-in-one golden's (the same T5 weights, fp32 here)."""
    path = tmp_path / "sd3_incl_clips_t5xxl.safetensors"
    t5 = {f"text_encoders.t5xxl.transformer.{k}": v for k, v in _raw(T5).items()}
    t5["text_encoders.t5xxl.transformer.encoder.embed_tokens.weight"] = t5[
        "text_encoders.t5xxl.transformer.shared.weight"
    ]
    save_file({**_raw(TINY_SD3 / "sd3_incl_clips_fp16.safetensors"), **t5}, str(path))
    assert load_checkpoint(path, FAMILIES).unknown == ()
    case = info(TINY_SD3)["files"]["sd3_incl_clips_fp16"]["case"]
    image = generate(path, "reference", case, {})
    assert float(np.abs(image - golden("sd3_incl_clips_fp16", "image")).max()) <= IMAGE_TOLERANCE


@pytest.mark.parametrize(("backend", "file"), IMAGE_CASES)
def test_img2img_equals_diffusers_from_the_single_files(tiny_families: None, backend: str, file: str) -> None:
    """img2img from the single files, the VAE encoder read where the decoder is (the all-in-one
    file's ``first_stage_model.``, else ``--vae``): the image ``StableDiffusion3Img2ImgPipeline`` /
    ``ChromaImg2ImgPipeline`` makes with what diffusers loaded from the same files, the same init
    image, strength and noise stream (tiny_flow's ``sd3_img2img`` / ``chroma_img2img`` case)."""
    from PIL import Image

    require_backend(backend)
    case = info(folder(file))["files"][file]["img2img_case"]
    init = Image.fromarray(golden(file, "img2img_init_image", top=True))
    path = folder(file) / f"{file}.safetensors"
    image = generate(path, backend, case, SIDE[file], init_image=init, strength=case["strength"])
    diff = float(np.abs(image - golden(file, "img2img_image")).max())
    txt2img = float(np.abs(image - golden(file, "image")).max())
    print(f"{file} img2img on {backend}: image max |diff| {diff:.3g} (vs the txt2img golden {txt2img:.3g})")
    assert diff <= IMAGE_TOLERANCE < txt2img


def _decoder_only(path: Path, prefix: str, out: Path) -> Path:
    """``path`` without its VAE encoder's tensors (``<prefix>encoder.*``): a decoder-only VAE."""
    save_file({k: v for k, v in _raw(path).items() if not k.startswith(prefix + "encoder.")}, str(out))
    return out


@pytest.mark.parametrize("file", ["sd3_incl_clips_fp16", "sd35_transformer_bf16", "chroma_bf16"])
def test_a_decoder_only_vae_runs_txt2img_and_refuses_img2img(tiny_families: None, tmp_path: Path, file: str) -> None:
    """A VAE without its encoder (a decoder-only ``--vae`` file, or an all-in-one file whose
    ``first_stage_model.`` has only the decoder): the file loads without ``vae_encoder`` and makes
    diffusers' txt2img image; img2img is one ModelFormatError naming the encoder key it lacks."""
    from PIL import Image

    path, files = folder(file) / f"{file}.safetensors", dict(SIDE[file])
    if file == "sd3_incl_clips_fp16":
        path = _decoder_only(path, "first_stage_model.", tmp_path / f"{file}.safetensors")
        missing = "first_stage_model.encoder.conv_in.weight"
    else:
        files["vae"] = _decoder_only(AE, "", tmp_path / "decoder_only_ae.safetensors")
        missing = ("first_stage_model." if file.startswith("sd3") else "vae.") + "encoder.conv_in.weight"
    result = load_checkpoint(path, FAMILIES, files=files)
    assert "vae_encoder" not in result.weights and result.absent == {"vae_encoder": missing}
    assert result.unknown == ()
    case = info(folder(file))["files"][file]["case"]
    image = generate(path, "reference", case, files)
    assert float(np.abs(image - golden(file, "image")).max()) <= IMAGE_TOLERANCE
    pipe = sdkit.load_pipeline(path, backend="reference", prepare=False, **files)
    try:
        assert "vae_encoder" not in pipe.components
        with pytest.raises(ModelFormatError) as err:
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
    finally:
        pipe.close()
    message = str(err.value)
    print(message)
    assert "img2img needs a VAE encoder (vae_encoder)" in message and f"decoder-only (no {missing})" in message
    assert "(--vae)" in message and "txt2img runs without it" in message and "model.onnx" not in message


def test_a_partial_vae_encoder_is_refused(tmp_path: Path) -> None:
    """Some of the encoder's tensors but not all: the usual incomplete-checkpoint error, counted."""
    tensors = _raw(AE)
    del tensors["encoder.conv_in.weight"]
    vae = tmp_path / "partial_ae.safetensors"
    save_file(tensors, str(vae))
    with pytest.raises(ModelFormatError, match=r"the vae_encoder's 1 of \d+\): vae\.encoder\.conv_in\.weight"):
        load_checkpoint(TINY_CHROMA / "chroma_bf16.safetensors", FAMILIES, files={**SIDE["chroma_bf16"], "vae": vae})


def test_set_checkpoint_adds_and_drops_the_optional_encoder(tiny_families: None, tmp_path: Path) -> None:
    """Swapping to a file of the family whose VAE is decoder-only drops ``vae_encoder`` (img2img
    refused); swapping back makes it again, with the load's backend, and img2img runs."""
    from PIL import Image

    full = TINY_SD3 / "sd3_incl_clips_fp16.safetensors"
    partial = _decoder_only(full, "first_stage_model.", tmp_path / "decoder_only.safetensors")
    case = info(TINY_SD3)["files"]["sd3_incl_clips_fp16"]["img2img_case"]
    pipe = sdkit.load_pipeline(partial, backend="reference", threads=1, t5xxl=T5)
    try:
        assert "vae_encoder" not in pipe.components
        pipe.set_checkpoint(full)
        assert "vae_encoder" in pipe.components
        image = pipe.generate(
            "a photo of an astronaut riding a horse on the moon",
            init_image=Image.fromarray(golden("sd3_incl_clips_fp16", "img2img_init_image", top=True)),
            **{
                k: case[k]
                for k in ("negative_prompt", "strength", "seed", "steps", "guidance_scale", "max_sequence_length")
            },
            output_type="np",
        )
        assert pipe.backends()["vae_encoder"] == "reference"
        assert float(np.abs(image - golden("sd3_incl_clips_fp16", "img2img_image")).max()) <= IMAGE_TOLERANCE
        pipe.set_checkpoint(partial)
        assert "vae_encoder" not in pipe.components
        with pytest.raises(ModelFormatError, match="decoder-only"):
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
    finally:
        pipe.close()


PROMPT = "a photo of an astronaut riding a horse on the moon"
CASE_KEYS = ("negative_prompt", "seed", "steps", "guidance_scale", "width", "height", "max_sequence_length")


def _image(pipe: Any, file: str, img2img: bool = False) -> np.ndarray:
    """``file``'s golden case on a loaded pipeline (``img2img``: its img2img case and init image)."""
    from PIL import Image

    case = info(folder(file))["files"][file]["img2img_case" if img2img else "case"]
    extra: dict[str, Any] = {}
    if img2img:
        init = Image.fromarray(golden(file, "img2img_init_image", top=True))
        extra = {"init_image": init, "strength": case["strength"]}
    return np.asarray(pipe.generate(PROMPT, **{k: case[k] for k in CASE_KEYS}, **extra, output_type="np"))


def _vae_files(file: str, tmp_path: Path) -> tuple[Path, dict[str, Path], Path, Path]:
    """The checkpoint, its component files with a decoder-only VAE, a full VAE file and a
    decoder-only one. The all-in-one SD3 file: its own VAE cut to the decoder, and its
    ``first_stage_model.*`` tensors as the VAE files (an extracted ``sd3_vae``); Chroma: ae.safetensors."""
    path, files = folder(file) / f"{file}.safetensors", dict(SIDE[file])
    if "vae" in files:
        full = AE
        files["vae"] = decoder_only = _decoder_only(AE, "", tmp_path / "decoder_only_ae.safetensors")
        return path, files, full, decoder_only
    full = tmp_path / "sd3_vae.safetensors"
    save_file({k: v for k, v in _raw(path).items() if k.startswith("first_stage_model.")}, str(full))
    decoder_only = _decoder_only(full, "first_stage_model.", tmp_path / "sd3_vae_decoder_only.safetensors")
    return _decoder_only(path, "first_stage_model.", tmp_path / f"{file}.safetensors"), files, full, decoder_only


@pytest.mark.parametrize("file", ["sd3_incl_clips_fp16", "chroma_bf16"])
def test_set_vae_takes_both_halves_from_the_vae_file(tiny_families: None, tmp_path: Path, file: str) -> None:
    """``set_vae`` gives the encoder and the decoder from the one file (A1111, ComfyUI). Loaded
    with a decoder-only VAE, ``set_vae(full file)`` adds the encoder (the load's backend) and
    img2img makes diffusers' img2img image; ``set_vae(decoder-only file)`` on a pipeline with
    its encoder releases it (no compiled encoder or component left alive), txt2img still makes
    diffusers' image, img2img is one ModelFormatError naming the key the file lacks, and
    ``set_vae(None)`` brings the checkpoint's own VAE (here decoder-only: no encoder) back."""
    import gc
    import weakref

    from PIL import Image

    path, files, full, decoder_only = _vae_files(file, tmp_path)
    missing = ("first_stage_model." if file.startswith("sd3") else "") + "encoder.conv_in.weight"
    pipe = sdkit.load_pipeline(path, backend="reference", threads=1, **files)
    try:
        assert "vae_encoder" not in pipe.components
        pipe.set_vae(full)
        assert "vae_encoder" in pipe.components
        diff = float(np.abs(_image(pipe, file, img2img=True) - golden(file, "img2img_image")).max())
        print(f"{file}: decoder-only load, set_vae({full.name}): img2img max |diff| {diff:.3g}")
        assert diff <= IMAGE_TOLERANCE and pipe.backends()["vae_encoder"] == "reference"
        encoder = pipe.components["vae_encoder"]
        assert encoder.compiled is not None  # memory="keep": resident after the img2img
        compiled, component = weakref.ref(encoder.compiled), weakref.ref(encoder)
        del encoder
        pipe.set_vae(decoder_only)
        gc.collect()
        assert "vae_encoder" not in pipe.components and compiled() is None and component() is None
        diff = float(np.abs(_image(pipe, file) - golden(file, "image")).max())
        print(f"{file}: set_vae({decoder_only.name}): txt2img max |diff| {diff:.3g}")
        assert diff <= IMAGE_TOLERANCE
        with pytest.raises(ModelFormatError) as err:
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
        message = str(err.value)
        print(message)
        assert f"{decoder_only.name}, is decoder-only (no {missing})" in message
        assert "img2img needs a VAE encoder (vae_encoder)" in message and "txt2img runs without it" in message
        pipe.set_vae(full)
        assert "vae_encoder" in pipe.components
        pipe.set_vae(None)  # the checkpoint's VAE: decoder-only
        assert "vae_encoder" not in pipe.components
        with pytest.raises(ModelFormatError, match=r"the tiny \w+ VAE it was loaded with is decoder-only"):
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
    finally:
        pipe.close()


def test_set_vae_decoder_only_drops_the_checkpoints_encoder(tiny_families: None, tmp_path: Path) -> None:
    """Loaded with its encoder (Chroma with ae.safetensors), ``set_vae(decoder-only file)``
    drops the checkpoint's encoder rather than pair it with the new decoder, and ``set_checkpoint``
    keeps that (the VAE file decides); ``set_vae(None)`` makes the checkpoint's encoder again."""
    from PIL import Image

    decoder_only = _decoder_only(AE, "", tmp_path / "decoder_only_ae.safetensors")
    pipe = sdkit.load_pipeline(
        TINY_CHROMA / "chroma_bf16.safetensors", backend="reference", prepare=False, **SIDE["chroma_bf16"]
    )
    try:
        assert "vae_encoder" in pipe.components
        assert set(pipe.set_vae(decoder_only)) == {"vae_decoder"}
        assert "vae_encoder" not in pipe.components
        pipe.set_checkpoint(TINY_CHROMA / "chroma_fp16_comfy.safetensors")  # its VAE (ae) has the encoder
        assert "vae_encoder" not in pipe.components
        with pytest.raises(ModelFormatError, match=r"decoder_only_ae.safetensors, is decoder-only \(no encoder"):
            pipe.generate("a photo", init_image=Image.new("RGB", (48, 32)), strength=0.5, steps=1)
        pipe.set_vae(None)
        assert "vae_encoder" in pipe.components
        assert pipe.components["vae_encoder"].source.describe().startswith("chroma_fp16_comfy")
    finally:
        pipe.close()


def test_missing_component_files_are_named(tiny_families: None) -> None:
    """What the file lacks, by flag; what it holds is not asked for."""
    with pytest.raises(ModelFormatError) as err:
        sdkit.load_pipeline(TINY_SD3 / "sd3_incl_clips_fp16.safetensors")
    message = str(err.value)
    assert "does not hold the tiny SD3 t5xxl" in message and "--t5xxl FILE" in message
    assert "--clip_l" not in message and "--vae" not in message
    with pytest.raises(ModelFormatError) as err:
        sdkit.load_pipeline(TINY_SD3 / "sd35_transformer_bf16.safetensors", t5xxl=T5)
    message = str(err.value)
    assert "holds the tiny SD3 transformer only" in message
    assert "--clip_l FILE" in message and "--clip_g FILE" in message and "--vae FILE" in message
    with pytest.raises(ModelFormatError, match="--t5xxl FILE"):
        sdkit.load_pipeline(TINY_CHROMA / "chroma_bf16.safetensors", vae=AE)


def test_a_renamed_key_is_named(tmp_path: Path) -> None:
    tensors = _raw(TINY_SD3 / "sd35_transformer_bf16.safetensors")
    tensors["joint_blocks.0.x_block.mlp.fc2_renamed.weight"] = tensors.pop("joint_blocks.0.x_block.mlp.fc2.weight")
    path = tmp_path / "renamed.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelFormatError) as err:
        load_checkpoint(path, FAMILIES, files=SIDE["sd35_transformer_bf16"])
    assert "model.diffusion_model.joint_blocks.0.x_block.mlp.fc2.weight (missing)" in str(err.value)
    assert "fc2_renamed" in str(err.value)


def test_image_goldens_move_with_the_file_dtype() -> None:
    """The goldens check what they claim: the half-precision files' images differ from the fp32
    weights' (tiny_flow's goldens) by more than the tolerance."""
    with np.load(TINY_FLOW / "golden.npz") as data:
        fp32 = {k: data[f"{k}/image"] for k in ("sd3_cfg", "chroma_cfg")}
    for file, case in (("sd35_transformer_bf16", "sd3_cfg"), ("chroma_bf16", "chroma_cfg")):
        assert float(np.abs(golden(file, "image") - fp32[case]).max()) > IMAGE_TOLERANCE


def test_command_line_takes_clip_g(tiny_families: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sdkit generate --diffusion-model sd35.safetensors --clip_l --clip_g --t5xxl --vae`` (as
    stable-diffusion.cpp): the PNG holds diffusers' image (8-bit); without --clip_g, one line."""
    from PIL import Image

    from sdkit.cli.main import main

    require_backend("ggml")
    out = tmp_path / "sd3.png"
    model = TINY_SD3 / "sd35_transformer_bf16.safetensors"
    case = info(TINY_SD3)["files"]["sd35_transformer_bf16"]["case"]
    argv = ["generate", "a photo of an astronaut riding a horse on the moon", "--diffusion-model", str(model)]
    argv += ["-o", str(out), "--backend", "ggml", "--threads", "1", "--steps", str(case["steps"])]
    argv += ["--seed", str(case["seed"]), "--cfg", str(case["guidance_scale"]), "--negative", case["negative_prompt"]]
    argv += ["--width", "48", "--height", "32", "--max-sequence-length", "32"]
    side = SIDE["sd35_transformer_bf16"]
    files = ["--clip_l", str(side["clip_l"]), "--t5xxl", str(side["t5xxl"]), "--vae", str(side["vae"])]
    assert main([*argv, *files, "--clip_g", str(side["clip_g"])]) == 0
    with Image.open(out) as image:
        pixels = np.asarray(image, np.float32) / 255.0
    assert np.abs(pixels - golden("sd35_transformer_bf16", "image")[0]).max() <= 1 / 255 + IMAGE_TOLERANCE
    capsys.readouterr()
    assert main([*argv, *files, "--force"]) == 1  # --force: the same -o again, so the missing clip_g is the error
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("sdkit: error: ") and "--clip_g FILE" in err and err.count("\n") == 1


# --- full size: header-only files of the published architectures ------------------------------


def header_only(path: Path, shapes: dict[str, tuple[int, ...]], prefix: str = "", dtype: str = "BF16") -> Path:
    """A real safetensors header over a sparse data region (nothing here reads data)."""
    return write_header_only_safetensors(path, {prefix + key: shape for key, shape in shapes.items()}, dtype=dtype)


def sd3_keys(arch: Sd3Arch) -> dict[str, tuple[int, ...]]:
    """Stability's MMDiT key list for ``arch`` (``fixtures/families/sd3_chroma_full_size_check.py``
    checks the full lists against diffusers' converter)."""
    h, last = arch.hidden, arch.depth - 1
    shapes: dict[str, tuple[int, ...]] = {"pos_embed": (1, arch.positions, h)}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out, inp), (out,)

    shapes["x_embedder.proj.weight"], shapes["x_embedder.proj.bias"] = (h, 16, 2, 2), (h,)
    linear("t_embedder.mlp.0", h, 256)
    linear("t_embedder.mlp.2", h, h)
    linear("y_embedder.mlp.0", h, arch.pooled_dim)
    linear("y_embedder.mlp.2", h, h)
    linear("context_embedder", h, arch.context_dim)
    for i in range(arch.depth):
        b = f"joint_blocks.{i}."
        dual = i in arch.dual_attention_layers
        linear(f"{b}x_block.adaLN_modulation.1", (9 if dual else 6) * h, h)
        linear(f"{b}context_block.adaLN_modulation.1", (2 if i == last else 6) * h, h)
        for side in ("x_block", "context_block"):
            linear(f"{b}{side}.attn.qkv", 3 * h, h)
            if arch.qk_norm:
                shapes[f"{b}{side}.attn.ln_q.weight"] = shapes[f"{b}{side}.attn.ln_k.weight"] = (64,)
            if side == "x_block" or i != last:
                linear(f"{b}{side}.attn.proj", h, h)
                linear(f"{b}{side}.mlp.fc1", 4 * h, h)
                linear(f"{b}{side}.mlp.fc2", h, 4 * h)
        if dual:
            linear(f"{b}x_block.attn2.qkv", 3 * h, h)
            linear(f"{b}x_block.attn2.proj", h, h)
            shapes[f"{b}x_block.attn2.ln_q.weight"] = shapes[f"{b}x_block.attn2.ln_k.weight"] = (64,)
    linear("final_layer.linear", 64, h)
    linear("final_layer.adaLN_modulation.1", 2 * h, h)
    return shapes


def chroma_keys() -> dict[str, tuple[int, ...]]:
    h, a, mlp = 3072, 5120, 4 * 3072
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out, inp), (out,)

    linear("img_in", h, 64)
    linear("txt_in", h, 4096)
    linear("distilled_guidance_layer.in_proj", a, 64)
    for i in range(5):
        linear(f"distilled_guidance_layer.layers.{i}.in_layer", a, a)
        linear(f"distilled_guidance_layer.layers.{i}.out_layer", a, a)
        shapes[f"distilled_guidance_layer.norms.{i}.scale"] = (a,)
    linear("distilled_guidance_layer.out_proj", h, a)
    for i in range(19):
        for side in ("img", "txt"):
            b = f"double_blocks.{i}.{side}"
            linear(f"{b}_attn.qkv", 3 * h, h)
            linear(f"{b}_attn.proj", h, h)
            linear(f"{b}_mlp.0", mlp, h)
            linear(f"{b}_mlp.2", h, mlp)
            shapes[f"{b}_attn.norm.query_norm.scale"] = shapes[f"{b}_attn.norm.key_norm.scale"] = (128,)
    for i in range(38):
        linear(f"single_blocks.{i}.linear1", 3 * h + mlp, h)
        linear(f"single_blocks.{i}.linear2", h, h + mlp)
        shapes[f"single_blocks.{i}.norm.query_norm.scale"] = shapes[f"single_blocks.{i}.norm.key_norm.scale"] = (128,)
    linear("final_layer.linear", 64, h)
    return shapes


FULL_SIZE = [
    ("sd3_medium.safetensors", "SD3_MEDIUM_ARCH", "model.diffusion_model.", "sd3_medium", "SD3 Medium"),
    ("sd3.5_large.safetensors", "SD35_LARGE_ARCH", "model.diffusion_model.", "sd35_large", "SD 3.5 Large"),
    ("sd3.5_medium.safetensors", "SD35_MEDIUM_ARCH", "", "sd35_medium", "SD 3.5 Medium"),
    ("chroma-unlocked-v37.safetensors", None, "", "chroma", "Chroma"),
    ("Chroma1-HD_comfy.safetensors", None, "model.diffusion_model.", "chroma", "Chroma"),
]


@pytest.mark.parametrize(("name", "arch", "prefix", "family", "label"), FULL_SIZE)
def test_full_size_files_are_detected_and_ask_for_what_they_lack(
    tmp_path: Path, name: str, arch: str | None, prefix: str, family: str, label: str
) -> None:
    """The registered full-size families tell SD3 Medium, SD 3.5 Large and Medium (width, depth,
    position table, MMDiT-X) and Chroma apart from a header; ``sdkit inspect`` names them and what
    they need; ``load_pipeline`` goes on (every family's graphs ship) to what this MMDiT-only file
    lacks: its text encoders and VAE, asked for by flag."""
    import sdkit.families.sd3 as sd3

    shapes = sd3_keys(getattr(sd3, arch)) if arch else chroma_keys()
    path = header_only(tmp_path / name, shapes, prefix)
    checkpoint = Checkpoint.open(path)
    families = sdkit.pipelines.loaders.families.registered_families()
    assert detect(checkpoint, families).family.name == family
    described = describe(checkpoint, families)
    text = "\n".join(described.lines())
    assert f"{label} checkpoint" in text and "--t5xxl" in text
    parameters = sum(int(np.prod(s)) for s in shapes.values())
    assert dict(described.details)["transformer"].startswith(f"{parameters / 1e6:,.1f} M parameters")
    with pytest.raises(ModelFormatError, match="--t5xxl"):
        sdkit.load_pipeline(path)


FLUX_HEADERS = REPO / "fixtures" / "families" / "flux_full_size_headers.json"  # ae, clip_l, t5xxl_fp16


def flux_headers(file: str) -> tuple[dict[str, tuple[int, ...]], str]:
    """A published component file's tensors (``make_flux_headers.py``: BFL's ``ae.safetensors``,
    ComfyUI's ``clip_l.safetensors`` and ``t5xxl_fp16.safetensors``) and their dtype."""
    entry = json.loads(FLUX_HEADERS.read_text(encoding="utf-8"))[file]
    return {k: tuple(v) for k, v in entry["tensors"].items()}, entry["dtype"]


def clip_g_keys() -> dict[str, tuple[int, ...]]:
    """OpenCLIP bigG in transformers' ``CLIPTextModelWithProjection`` names (ComfyUI's
    ``clip_g.safetensors``): width 1280, 32 layers, MLP 5120, 77 positions, 49408 tokens."""
    h, t = 1280, "text_model."
    shapes: dict[str, tuple[int, ...]] = {
        f"{t}embeddings.token_embedding.weight": (49408, h),
        f"{t}embeddings.position_embedding.weight": (77, h),
        f"{t}final_layer_norm.weight": (h,),
        f"{t}final_layer_norm.bias": (h,),
        "text_projection.weight": (h, h),
    }
    for i in range(32):
        b = f"{t}encoder.layers.{i}."
        for name, out, inp in (
            *((f"self_attn.{x}_proj", h, h) for x in ("q", "k", "v", "out")),
            ("mlp.fc1", 4 * h, h),
            ("mlp.fc2", h, 4 * h),
        ):
            shapes[f"{b}{name}.weight"], shapes[f"{b}{name}.bias"] = (out, inp), (out,)
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"{b}{norm}.weight"], shapes[f"{b}{norm}.bias"] = (h,), (h,)
    return shapes


def test_full_size_sd3_all_in_one_file_maps_the_vae_encoder(tmp_path: Path) -> None:
    """SD3 Medium as Stability's ``sd3_medium_incl_clips_t5xxlfp16.safetensors`` (header only,
    fp16: the MMDiT, CLIP-L, bigG, T5-XXL and the 16-channel VAE in LDM names under
    ``first_stage_model.``, BFL's ``ae.safetensors`` tensors) loads on the shipped graphs with no
    component file: every initializer of every component found with its shape, the VAE encoder's
    (``flux_vae_encoder``) included, no key of the file unread."""
    import sdkit.families.sd3 as sd3

    shapes = {f"model.diffusion_model.{k}": v for k, v in sd3_keys(sd3.SD3_MEDIUM_ARCH).items()}
    for prefix, (keys, _) in (
        ("first_stage_model.", flux_headers("ae.safetensors")),
        ("text_encoders.clip_l.transformer.", flux_headers("clip_l.safetensors")),
        ("text_encoders.t5xxl.transformer.", flux_headers("t5xxl_fp16.safetensors")),
        ("text_encoders.clip_g.transformer.", (clip_g_keys(), "F16")),
    ):
        shapes.update({prefix + k: v for k, v in keys.items()})
    path = header_only(tmp_path / "sd3_medium_incl_clips_t5xxlfp16.safetensors", shapes, dtype="F16")
    counts = _loaded_counts(path, {}, "sd3_medium")
    print("SD3 Medium all-in-one:", counts)
    assert counts["vae_encoder"] == (106, 106) and counts["vae_decoder"] == (138, 138)
    assert all(found == total for found, total in counts.values())


@pytest.mark.parametrize("vae_in_file", [False, True], ids=["vae-file", "vae-in-checkpoint"])
@pytest.mark.parametrize(
    ("family", "arch"),
    [("SD3_MEDIUM", "SD3_MEDIUM_ARCH"), ("SD35_LARGE", "SD35_LARGE_ARCH"), ("SD35_MEDIUM", "SD35_MEDIUM_ARCH")],
)
def test_full_size_sd3_families_map_the_vae_encoder(tmp_path: Path, family: str, arch: str, vae_in_file: bool) -> None:
    """Each SD3 family's VAE onto the shipped ``flux_vae_decoder`` / ``flux_vae_encoder`` graphs
    (SD 3.5 Large's MMDiT graph is not shipped, so the family maps its VAE components directly):
    from the checkpoint's ``first_stage_model.`` (``sd3.5_large.safetensors``) or from a ``--vae``
    file (BFL's ``ae.safetensors`` names), decoder 138/138 and encoder 106/106 with their shapes,
    every VAE key read."""
    import sdkit.families.sd3 as sd3

    spec_family: Family = getattr(sd3, family)
    ae, dtype = flux_headers("ae.safetensors")
    shapes = sd3_keys(getattr(sd3, arch))
    if vae_in_file:
        shapes = {**shapes, **{f"first_stage_model.{k}": v for k, v in ae.items()}}
    checkpoint = Checkpoint.open(header_only(tmp_path / f"{family}.safetensors", shapes))
    if not vae_in_file:
        vae = write_header_only_safetensors(tmp_path / "ae.safetensors", ae, dtype=dtype)
        checkpoint = checkpoint.with_files({"vae": vae}, {"vae": spec_family.file_prefix("vae")})
    used: set[str] = set()
    counts = {}
    for component in ("vae_decoder", "vae_encoder"):
        spec = spec_family.components[component]
        assert spec.graph == f"flux_{component}" and component in spec_family.fp32_components
        specs = initializer_specs(spec.load_graph())
        found = 0
        for name, (shape, _) in specs.items():
            source = spec_family.key_map_entry(component, "sai", name, shape)
            key = checkpoint.find(source)
            assert key is not None and source.stored_shape_fits(checkpoint.entry(key).shape, shape), name
            used.add(key)
            found += 1
        counts[component] = (found, len(specs))
    print(f"{family} ({'first_stage_model.' if vae_in_file else '--vae'}): {counts}")
    assert counts == {"vae_decoder": (138, 138), "vae_encoder": (106, 106)}
    vae_keys = {k for k in checkpoint if k.startswith("first_stage_model.")}
    assert len(vae_keys) == len(ae) and used == vae_keys


@pytest.mark.parametrize("name", ["chroma-unlocked-v37.safetensors", "Chroma1-HD_comfy.safetensors"])
def test_full_size_chroma_maps_the_vae_encoder_from_ae(tmp_path: Path, name: str) -> None:
    """Chroma (lodestones' file, with or without ComfyUI's prefix) with ``--t5xxl
    t5xxl_fp16.safetensors --vae ae.safetensors`` (header only) loads on the shipped graphs:
    every initializer found with its shape, the VAE encoder's 106 included, nothing unread."""
    prefix = "model.diffusion_model." if "comfy" in name else ""
    path = header_only(tmp_path / name, chroma_keys(), prefix)
    files = {}
    for flag, file in (("t5xxl", "t5xxl_fp16.safetensors"), ("vae", "ae.safetensors")):
        keys, dtype = flux_headers(file)
        files[flag] = write_header_only_safetensors(tmp_path / file, keys, dtype=dtype)
    counts = _loaded_counts(path, files, "chroma")
    print(f"{name}:", counts)
    assert counts["vae_encoder"] == (106, 106) and counts["vae_decoder"] == (138, 138)
    assert all(found == total for found, total in counts.values())


def _loaded_counts(path: Path, files: dict[str, Path], family: str) -> dict[str, tuple[int, int]]:
    """``load_pipeline(path, **files)`` (nothing compiled, nothing read): per component, the graph
    initializers given weights of their shape, and how many the graph has; no key unread."""
    pipe = sdkit.load_pipeline(path, backend="reference", prepare=False, **files)
    try:
        mapped = pipe.checkpoint
        assert mapped is not None and mapped.family.name == family
        assert mapped.unknown == () and mapped.absent == {}
        assert set(pipe.components) == set(mapped.family.components)
        counts = {}
        for component, spec in mapped.family.components.items():
            graph = {t.name: tuple(t.dims) for t in spec.load_graph().proto.graph.initializer}
            weights = mapped.weights[component]
            found = sum(1 for n in weights if graph.get(n) == weights.spec(n)[0])
            counts[component] = (found, len(graph))
        return counts
    finally:
        pipe.close()
