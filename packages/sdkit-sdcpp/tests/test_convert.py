"""``sdkit convert MODEL --to gguf --type ...`` through stable-diffusion.cpp's converter: the file it
writes is read back by llama.cpp's ``gguf`` package (an independent reader and dequantizer) and by
sdkit's own header reader, and the dequantized weights are the originals within each type's step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sdcpp_helpers import needs_binding

from sdkit.cli.main import main
from sdkit.errors import InputError, OptionError
from sdkit.families import gguf_reader
from sdkit_sdcpp.convert import convert_to_gguf, output_type

WEIGHTS = {
    "model.diffusion_model.input_blocks.1.1.proj_in.weight": (512, 512),
    "model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3),
    "model.diffusion_model.out.2.bias": (4,),
}


def _checkpoint(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in WEIGHTS.items()}
    save_file(tensors, str(path))
    return tensors


@needs_binding
@pytest.mark.parametrize(("kind", "bound"), [("q8_0", 1 / 127), ("q4_K", 0.25), ("f16", 1e-3)])
def test_converted_weights_read_back(tmp_path: Path, kind: str, bound: float) -> None:
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    tensors = _checkpoint(tmp_path / "model.safetensors")
    out = convert_to_gguf(tmp_path / "model.safetensors", tmp_path / f"model-{kind}.gguf", kind)
    ours = {t.name: t for t in gguf_reader.read_header(out).tensors}
    matrix = "model.diffusion_model.input_blocks.1.1.proj_in.weight"
    assert ours[matrix].type == kind
    assert gguf_reader.read_header(out).family == "SD 1.x"
    for tensor in gguf.GGUFReader(str(out)).tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        assert ours[tensor.name].shape == shape == tensors[tensor.name].shape
        values = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        original = tensors[tensor.name]
        assert np.abs(values - original).max() <= bound * np.abs(original).max() + 1e-6, tensor.name


@needs_binding
def test_cli_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checkpoint(tmp_path / "model.safetensors")
    assert main(["convert", str(tmp_path / "model.safetensors"), "--to", "gguf", "--type", "q4_k"]) == 0
    out = tmp_path / "model-q4_K.gguf"
    assert f"wrote {out}" in capsys.readouterr().out
    assert gguf_reader.read_header(out).quantization == "q4_K"
    assert main(["convert", str(tmp_path / "model.safetensors"), "--type", "q4_K"]) == 1
    assert "exists: pass --force" in capsys.readouterr().err
    assert main(["inspect", str(out)]) == 0
    assert "SD 1.x, quantization q4_K" in capsys.readouterr().out


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="--type 'q9'"):
        output_type("q9")
    pickle = tmp_path / "model.ckpt"
    pickle.write_bytes(b"PK")
    with pytest.raises(InputError, match="pickles are refused"):
        convert_to_gguf(pickle, tmp_path / "out.gguf")
    with pytest.raises(InputError, match="no such file"):
        convert_to_gguf(tmp_path / "missing.safetensors", tmp_path / "out.gguf")
