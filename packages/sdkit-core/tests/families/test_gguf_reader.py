"""The GGUF header reader against files llama.cpp's ``gguf`` package writes (an independent writer
and reader: a test tool, dev.py's TEST_TOOLS), and the family the tensor names say."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from sdkit.errors import ModelFormatError
from sdkit.families import gguf_reader
from sdkit.testing.gguf_files import write_gguf

SD1_KEYS = {
    "model.diffusion_model.input_blocks.0.0.weight": ((320, 4, 3, 3), "f16"),
    "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": ((320, 768), "q8_0"),
    "model.diffusion_model.input_blocks.1.1.proj_in.weight": ((320, 320), "q8_0"),
    "model.diffusion_model.out.2.bias": ((4,), "f32"),
}


def test_header_matches_the_gguf_package(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from gguf import GGUFReader

    path = write_gguf(tmp_path / "sd1.gguf", SD1_KEYS, {"general.name": "tiny"})
    header = gguf_reader.read_header(path)
    reference = GGUFReader(str(path))
    assert [t.name for t in header.tensors] == [t.name for t in reference.tensors]
    for ours, theirs in zip(header.tensors, reference.tensors, strict=True):
        assert ours.shape == tuple(int(d) for d in reversed(theirs.shape.tolist()))
        assert ours.type == theirs.tensor_type.name.lower().replace("_k", "_K")
    assert header.metadata["general.name"] == "tiny"
    assert header.quantization == "q8_0"  # most matrices; the conv stays f16, the bias f32
    assert header.type_counts() == {"f16": 1, "q8_0": 2, "f32": 1}
    assert header.family == "SD 1.x"


@pytest.mark.parametrize(
    ("keys", "family"),
    [
        ({"double_blocks.0.img_attn.qkv.weight": (3, 3), "single_blocks.0.linear1.weight": (3, 3)}, "FLUX.1"),
        ({"double_blocks.0.a": (1,), "single_blocks.0.b": (1,), "img_in.weight": (3072, 384)}, "FLUX.1 Fill"),
        (
            {"double_blocks.0.a": (1,), "single_blocks.0.b": (1,), "distilled_guidance_layer.in_proj.weight": (1,)},
            "Chroma",
        ),
        ({"model.diffusion_model.joint_blocks.0.x.weight": (1,)}, "SD3"),
        ({"transformer_blocks.0.img_mod.1.weight": (1,)}, "Qwen-Image"),
        ({"noise_refiner.0.attention.qkv.weight": (1,)}, "Z-Image"),
        (
            {
                "model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3),
                "model.diffusion_model.label_emb.0.0.weight": (1,),
            },
            "SDXL",
        ),
        ({"model.diffusion_model.input_blocks.0.0.weight": (320, 9, 3, 3)}, "SD 1.x inpainting"),
        ({"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 1024)}, "SD 2.x"),
        ({"something.else": (1,)}, "unknown"),
    ],
)
def test_family_from_names(keys: dict[str, tuple[int, ...]], family: str) -> None:
    assert gguf_reader.family_of(keys) == family


def test_quantized_file(tmp_path: Path) -> None:
    keys = {f"double_blocks.{i}.img_mlp.0.weight": ((256, 256), "q4_K") for i in range(3)}
    keys["single_blocks.0.norm.scale"] = ((256,), "f32")
    header = gguf_reader.read_header(write_gguf(tmp_path / "flux-q4_K.gguf", keys))
    assert header.quantization == "q4_K"
    assert header.family == "FLUX.1"
    assert header.type_counts() == {"q4_K": 3, "f32": 1}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"PK\x03\x04 a zip", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00\x01", "truncated"),
        (b"GGUF\x09\x00\x00\x00" + b"\x00" * 16, "GGUF version 9"),
        (b"GGUF\x03\x00\x00\x00" + (1 << 40).to_bytes(8, "little") + b"\x00" * 8, "claims"),
    ],
)
def test_bad_headers_are_one_clear_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelFormatError, match=message):
        gguf_reader.read_header(path)


def test_inspect_names_family_and_quantization(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from sdkit.cli.main import main

    path = write_gguf(tmp_path / "sd1-q8_0.gguf", SD1_KEYS)
    assert main(["inspect", str(path)]) == 0
    assert "sd1-q8_0.gguf: GGUF v3, SD 1.x, quantization q8_0" in capsys.readouterr().out
    assert main(["inspect", str(path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["family"], found["quantization"], found["tensor_types"]) == (
        "SD 1.x",
        "q8_0",
        {"q8_0": 2, "f16": 1, "f32": 1},
    )


def test_a_gguf_file_without_its_engine_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sdkit
    from sdkit import plugins as plugins_module
    from sdkit.errors import BackendUnavailableError
    from sdkit.plugins import Plugins

    monkeypatch.setattr(plugins_module.manager, "_plugins", Plugins([]))
    path = write_gguf(tmp_path / "model.gguf", SD1_KEYS)
    with pytest.raises(
        BackendUnavailableError, match=r"model.gguf is a GGUF file, which sdkit runs on stable-diffusion.cpp"
    ):
        sdkit.load_pipeline(path)


def test_truncated_data_is_caught_from_the_header(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "sd1.gguf", SD1_KEYS)
    header = gguf_reader.read_header(path)
    header.check_complete()  # whole: the gguf package's layout (alignment, offsets) is read right
    data = path.read_bytes()
    end = header.data_start + max(t.offset + (t.nbytes or 0) for t in header.tensors)
    assert end <= len(data) < end + 32  # the last tensor ends there, padded to the 32-byte alignment
    path.write_bytes(data[:-100])
    with pytest.raises(ModelFormatError, match=r"sd1.gguf is truncated: its tensors end at byte"):
        gguf_reader.read_header(path).check_complete()


def _one_tensor_gguf(
    kv: bytes = b"", n_kv: int = 0, kind: int = 1, dims: tuple[int, ...] = (4, 8), data: int | None = None
) -> bytes:
    """A GGUF v3 file written by hand (no ``gguf`` package needed): ``kv`` the metadata, one
    tensor of ``dims`` (innermost first) and ggml type ``kind``, its data zero-filled (``data``
    bytes of it if given)."""

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    tensor = text("model.diffusion_model.out.2.weight") + struct.pack("<I", len(dims))
    tensor += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, n_kv) + kv + tensor
    return head + b"\0" * (-len(head) % 32) + b"\0" * (int(np.prod(dims)) * 2 if data is None else data)


def test_hostile_headers_found_in_the_second_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30's second pass (``tools/bad_inputs.py``): metadata arrays nested 100000 deep were
    a RecursionError; an unknown ggml type was listed as ``type 999`` and ``sdkit inspect``
    exited 0 on files whose tensors end past the file's end (truncated data, dims of 2^31 x 2^31,
    an offset of 2^63). Each is now one ``ModelFormatError`` / ``sdkit: error:`` line."""

    from sdkit.cli.main import main

    path = tmp_path / "bad.gguf"
    nested = struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100_000
    path.write_bytes(_one_tensor_gguf(nested + struct.pack("<IQ", 4, 0), n_kv=1))
    with pytest.raises(ModelFormatError, match="nested over 8 deep"):
        gguf_reader.read_header(path)
    path.write_bytes(_one_tensor_gguf(kind=999))
    with pytest.raises(ModelFormatError, match="unknown ggml type 999"):
        gguf_reader.read_header(path)
    whole = _one_tensor_gguf()
    path.write_bytes(whole)
    assert main(["inspect", str(path)]) == 0  # the whole file: fine
    capsys.readouterr()
    for data in (whole[:-10], _one_tensor_gguf(dims=(2**31, 2**31), data=64)):
        path.write_bytes(data)
        assert main(["inspect", str(path)]) == 1
        assert capsys.readouterr().err.strip().startswith("sdkit: error: bad.gguf is truncated")
