"""Pipelines from single-file checkpoints on the shipped (here: tiny) graphs, no export step.

Oracle: diffusers' ``StableDiffusionPipeline.from_single_file`` on the same files, with sdkit's
noise stream (``fixtures/families/tiny/<family>/goldens.npz``, ``<file>/txt2img/image``): Euler, 3
steps, CFG 7.5, 32x32, seed 11, the family's published scheduler config. Required: max |diff|
<= 1e-3 on [0, 1] pixels on the reference, ggml and openvino backends.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import ModelFormatError, UnsupportedModelError
from sdkit.families import Checkpoint, Family
from sdkit.testing.cli_output import without_progress

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
TOLERANCE = 1e-3
PROMPT = "a photo of an astronaut riding a horse on the moon"
REQUEST: dict[str, Any] = {
    "negative_prompt": "blurry, low quality",
    "steps": 3,
    "guidance_scale": 7.5,
    "width": 32,
    "height": 32,
    "seed": 11,
    "sampler": "euler",
    "output_type": "np",
}
FILES = {  # file -> family folder
    "sd1_fp32": "sd1",
    "sd1_fp16": "sd1",
    "sd1_bf16": "sd1",
    "sd1_diffusers_fp16": "sd1",
    "sd2v_fp16": "sd2v",
    "sd2v_bf16": "sd2v",
}


def golden(file: str) -> np.ndarray:
    family = FILES[file]
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as data:
        image: np.ndarray = data[f"{file.replace('diffusers_', '')}/txt2img/image"]
    return image


def _backend(name: str) -> None:
    info = next((b for b in sdkit.backends() if b.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"backend {name} unavailable: {info.reason if info else 'not installed'}")


def _generate(path: Path, backend: str, **kwargs: Any) -> tuple[np.ndarray, Any]:
    try:
        pipe = sdkit.load_pipeline(path, backend=backend, **kwargs)
    except UnsupportedModelError as exc:  # a backend gap: say which node, never work around it
        pytest.fail(f"{backend} cannot run a tiny family graph: {exc}")
    image = pipe.generate(PROMPT, **REQUEST)
    return image, pipe


CASES = [
    *[pytest.param("reference", file, id=f"reference-{file}") for file in FILES],
    # SD 1.x fp16 and bf16 on ggml and openvino: test_set_checkpoint_refits_the_compiled_components
    *[pytest.param(backend, "sd2v_fp16", id=f"{backend}-sd2v_fp16") for backend in ("ggml", "openvino")],
    *[
        pytest.param(backend, file, id=f"{backend}-{file}", marks=pytest.mark.slow)
        for backend in ("ggml", "openvino")
        for file in ("sd1_fp32", "sd1_fp16", "sd1_bf16", "sd1_diffusers_fp16", "sd2v_bf16")
    ],
]


@pytest.mark.parametrize(("backend", "file"), CASES)
def test_txt2img_equals_diffusers(tiny_families: dict[str, Family], backend: str, file: str) -> None:
    _backend(backend)
    image, pipe = _generate(TINY / FILES[file] / f"{file}.safetensors", backend)
    assert set(pipe.backends().values()) <= {backend, None}
    assert pipe.checkpoint is not None and pipe.checkpoint.family.name == f"tiny_{FILES[file]}"
    assert np.abs(image - golden(file)).max() <= TOLERANCE


def test_a_diffusers_folder_gives_the_files_image(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    folder = tmp_path / "sd1-diffusers"
    shutil.copytree(TINY / "sd1" / "config", folder)
    checkpoint = Checkpoint.open(TINY / "sd1" / "sd1_diffusers_fp16.safetensors")
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key in checkpoint:
        component, _, name = key.partition(".")
        parts.setdefault(component, {})[name] = np.asarray(checkpoint.files[0].raw(checkpoint.entry(key)))
    for component, arrays in parts.items():
        file = "model.safetensors" if component == "text_encoder" else "diffusion_pytorch_model.fp16.safetensors"
        save_file(arrays, str(folder / component / file))
    image, pipe = _generate(folder, "reference")
    assert pipe.config.tokenizers["text_encoder"] == folder / "tokenizer"  # the folder's own files
    assert np.abs(image - golden("sd1_fp16")).max() <= TOLERANCE


def test_prediction_option(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    """A SD 2.x-v file without its .yaml: ``prediction="v"`` gives diffusers' image; read as an
    epsilon model it does not."""
    copy = Path(shutil.copy(TINY / "sd2v" / "sd2v_fp16.safetensors", tmp_path / "sd2v.safetensors"))
    image, pipe = _generate(copy, "reference", prediction="v")
    assert pipe.config.prediction_type == "v_prediction"
    assert np.abs(image - golden("sd2v_fp16")).max() <= TOLERANCE
    image, pipe = _generate(copy, "reference", prediction="epsilon")
    assert pipe.config.prediction_type == "epsilon" and pipe.checkpoint.family.name == "tiny_sd2"
    assert np.abs(image - golden("sd2v_fp16")).max() > 0.01


def test_loading_a_file_detects_its_family_once(
    tiny_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header is read for the family once per load, and the shipped graphs checked once."""
    from sdkit.pipelines.loaders import families as pipeline_families

    calls: dict[str, int] = {"detect": 0, "require_graphs": 0}

    def counted(module: Any, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(pipeline_families, "detect")
    counted(pipeline_families, "require_graphs")
    sdkit.load_pipeline(TINY / "sd1" / "sd1_fp16.safetensors", backend="reference", memory="offload")
    assert calls == {"detect": 1, "require_graphs": 1}


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_set_checkpoint_refits_the_compiled_components(tiny_families: dict[str, Family], backend: str) -> None:
    """SD 1.x from the fp16 file, then the bf16 one swapped in: both images are diffusers'."""
    _backend(backend)
    image, pipe = _generate(TINY / "sd1" / "sd1_fp16.safetensors", backend)
    assert np.abs(image - golden("sd1_fp16")).max() <= TOLERANCE
    engines = {name: c.compiled for name, c in pipe.components.items()}
    swaps = pipe.set_checkpoint(TINY / "sd1" / "sd1_bf16.safetensors")
    assert swaps == {"unet": "refit", "text_encoder": "refit", "vae_decoder": "refit", "vae_encoder": "recompile"}
    assert all(pipe.components[n].compiled is engines[n] for n in ("unet", "text_encoder", "vae_decoder"))
    assert pipe.name == "sd1_bf16"
    image = pipe.generate(PROMPT, **REQUEST)
    assert np.abs(image - golden("sd1_bf16")).max() <= TOLERANCE
    with pytest.raises(ModelFormatError, match=r"is a tiny sd2v checkpoint, this pipeline runs tiny sd1"):
        pipe.set_checkpoint(TINY / "sd2v" / "sd2v_fp16.safetensors")


def test_set_checkpoint_under_offload(tiny_families: dict[str, Family]) -> None:
    _, pipe = _generate(TINY / "sd1" / "sd1_fp16.safetensors", "reference", memory="offload")
    assert set(pipe.set_checkpoint(TINY / "sd1" / "sd1_bf16.safetensors").values()) == {"recompile"}
    assert np.abs(pipe.generate(PROMPT, **REQUEST) - golden("sd1_bf16")).max() <= TOLERANCE


def test_set_checkpoint_needs_a_checkpoint_pipeline(tiny_families: dict[str, Family]) -> None:
    folder = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_pipeline" / "model"
    pipe = sdkit.load_pipeline(folder, backend="reference", memory="offload")
    with pytest.raises(ModelFormatError, match="was not loaded from a checkpoint file"):
        pipe.set_checkpoint(TINY / "sd1" / "sd1_fp16.safetensors")


def _corrupt(kind: str, tmp_path: Path) -> Path:
    source = TINY / "sd1" / "sd1_fp16.safetensors"
    data = source.read_bytes()
    path = tmp_path / f"{kind}.safetensors"
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "lying":
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        entry = header["model.diffusion_model.out.2.weight"]
        entry["shape"] = [entry["shape"][0] * 2, *entry["shape"][1:]]
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    elif kind == "pickle":
        path = tmp_path / "model.ckpt"
        path.write_bytes(b"PK\x03\x04 a torch zip")
    elif kind == "renamed":
        text = data.replace(b"model.diffusion_model.out.2.weight", b"model.diffusion_model.out.2.wEight")
        path.write_bytes(text)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", r"truncated\.safetensors is truncated: its header describes [\d,]+ bytes of tensor data"),
        ("lying", r"the header lies about tensor 'model\.diffusion_model\.out\.2\.weight'"),
        ("pickle", r"model\.ckpt: pickled checkpoints are refused \(unpickling can run code\)"),
        (
            "renamed",
            r"1 weight\(s\) missing .*out\.2\.weight \(missing\); keys in the file that nothing reads: .*wEight",
        ),
    ],
)
def test_bad_files_are_one_clear_error(
    tiny_families: dict[str, Family], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    from sdkit.cli.main import main

    path = _corrupt(kind, tmp_path)
    with pytest.raises(ModelFormatError, match=message):
        sdkit.load_pipeline(path, backend="reference")
    code = main(["generate", "--model", str(path), "a castle", "-o", str(tmp_path / "x.png"), "--backend", "reference"])
    err = without_progress(capsys.readouterr().err)
    assert code == 1 and err.startswith("sdkit: error: ") and err.count("\n") == 1, err
