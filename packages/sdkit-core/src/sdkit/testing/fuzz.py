"""Fuzz targets for the readers of untrusted input (issue 15): each takes arbitrary bytes and
either succeeds or raises an ``SdkitError``; any other exception (or a crash) is a bug.

- ``onnx``: an ``.onnx`` file through ``sdkit.load_model`` and the memory check of compile
- ``safetensors``: the header check and ``WeightSet.load_safetensors``
- ``npy``: ``sdkit.files.read_npy`` (the ``--input`` reader)
- ``prompt``: the CLIP tokenizer and A1111 prompt weighting on arbitrary text
- ``tokenizer``: a tokenizer folder whose ``vocab.json`` / ``tokenizer_config.json`` are the bytes
- ``pipeline``: a pipeline folder whose config file (the first byte picks which) is the bytes

Run by ``packages/sdkit-core/tests/test_fuzz.py`` (hypothesis mutations of the committed corpus
in ``tests/data/fuzz``, a few seconds in CI) and by ``tools/fuzz.py`` (atheris, coverage-guided,
for minutes; its figures in ``tools/FUZZING.md``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path

from sdkit.errors import SdkitError

Target = Callable[[bytes], None]
_PIPELINE_FILES = (
    "model_index.json",
    "unet/config.json",
    "vae_decoder/config.json",
    "scheduler/scheduler_config.json",
    "text_encoder/config.json",
    "tokenizer/tokenizer_config.json",
)


@cache
def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="sdkit-fuzz-"))


def _file(name: str, data: bytes) -> Path:
    path = _scratch() / name
    path.write_bytes(data)
    return path


def fuzz_onnx(data: bytes) -> None:
    from sdkit.api import as_model
    from sdkit.limits import check_graph_memory, shape_like

    model = as_model(_file("model.onnx", data))
    check_graph_memory(model.graph.proto, shape_like(model.graph.proto, model.weights))
    _ = [(i.name, i.shape, i.dtype) for i in (*model.inputs, *model.outputs)]


def fuzz_safetensors(data: bytes) -> None:
    from sdkit.files import check_safetensors_header
    from sdkit.model import WeightSet

    path = _file("weights.safetensors", data)
    check_safetensors_header(path)
    WeightSet.load_safetensors(path)


def fuzz_npy(data: bytes) -> None:
    from sdkit.files import read_npy

    read_npy(_file("input.npy", data))


@cache
def _tiny_pipeline_copy(tiny: Path) -> Path:
    copy = _scratch() / "pipeline"
    shutil.copytree(tiny, copy)
    return copy


def tiny_pipeline() -> Path:
    """The repository's tiny pipeline (``fixtures/tiny_pipeline/model``), found from here."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "fixtures" / "tiny_pipeline" / "model"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("fixtures/tiny_pipeline/model is not in any parent folder")


@cache
def _tokenizer() -> object:
    from sdkit.pipelines.text.clip_tokenizer import ClipTokenizer

    return ClipTokenizer(tiny_pipeline() / "tokenizer")


def fuzz_prompt(data: bytes) -> None:
    from sdkit.pipelines.text.prompt_weights import parse_prompt_attention

    text = data.decode("utf-8", errors="replace")
    tokenizer = _tokenizer()
    tokenizer([text, text[::-1]])  # type: ignore[operator]
    parse_prompt_attention(text)


def fuzz_tokenizer(data: bytes) -> None:
    from sdkit.pipelines.text.clip_tokenizer import ClipTokenizer

    folder = _scratch() / "tokenizer"
    if not folder.is_dir():
        shutil.copytree(tiny_pipeline() / "tokenizer", folder)
    original = tiny_pipeline() / "tokenizer"
    for name in ("vocab.json", "tokenizer_config.json"):
        shutil.copyfile(original / name, folder / name)
    (folder / ("vocab.json" if data[:1] < b"\x80" else "tokenizer_config.json")).write_bytes(data[1:])
    ClipTokenizer(folder)(["a photo of a cat", ""])


def fuzz_pipeline(data: bytes) -> None:
    from sdkit.pipelines.loaders.diffusers_folder import folder_config, read_folder

    folder = _tiny_pipeline_copy(tiny_pipeline())
    for name in _PIPELINE_FILES:
        shutil.copyfile(tiny_pipeline() / name, folder / name)
    which = _PIPELINE_FILES[data[0] % len(_PIPELINE_FILES)] if data else _PIPELINE_FILES[0]
    (folder / which).write_bytes(data[1:])
    config = folder_config(read_folder(folder))
    config.latent_shape(1, config.default_size, config.default_size)


TARGETS: dict[str, Target] = {
    "onnx": fuzz_onnx,
    "safetensors": fuzz_safetensors,
    "npy": fuzz_npy,
    "prompt": fuzz_prompt,
    "tokenizer": fuzz_tokenizer,
    "pipeline": fuzz_pipeline,
}


def run_one(target: Target, data: bytes) -> None:
    """``target(data)``: an ``SdkitError`` is the expected refusal; anything else propagates."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(SdkitError):  # the expected refusal
            target(data)
