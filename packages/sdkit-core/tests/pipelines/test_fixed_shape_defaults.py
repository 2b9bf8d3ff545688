"""A model's default size is one it runs: a denoiser graph exported with fixed input shapes (the
tiny Flux and Chroma transformers take 96 image tokens and 32 text tokens) sets the default size
and T5 token count; the graph inputs are read without parsing the weights, checked against onnx's
own parse of the file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from sdkit.cli.main import main
from sdkit.errors import ModelFormatError
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.loaders.diffusers_folder import fixed_geometry, folder_config, read_folder
from sdkit.pipelines.loaders.graph_inputs import static_input_dims

ROOT = Path(__file__).resolve().parents[4] / "fixtures"
FLOW = ROOT / "tiny_flow"
pytestmark = pytest.mark.skipif(not (FLOW / "golden.json").is_file(), reason="fixtures/tiny_flow missing")


def _onnx_dims(path: Path) -> dict[str, tuple[int | None, ...]]:
    graph = onnx.load(path, load_external_data=False).graph
    return {
        v.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim)
        for v in graph.input
    }


@pytest.mark.parametrize(
    "graph",
    [
        "tiny_flow/flux_dev/transformer",
        "tiny_flow/chroma/transformer",
        "tiny_flow/sd3/transformer",
        "tiny_pipeline/model/unet",
    ],
)
def test_graph_inputs_match_onnx(graph: str) -> None:
    path = ROOT / graph / "model.onnx"
    assert static_input_dims(path) == _onnx_dims(path)


def test_a_graph_with_embedded_weights_and_fixed_latents(tmp_path: Path) -> None:
    """Inputs after a large initializer are found; a UNet-style [B, C, h, w] input gives (w, h) cells."""
    weight = numpy_helper.from_array(np.arange(300_000, dtype=np.float32), "w")
    node = helper.make_node("Identity", ["sample"], ["out"])
    sample = helper.make_tensor_value_info("sample", TensorProto.FLOAT, [1, 4, 6, 10])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 6, 10])
    path = tmp_path / "unet" / "model.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(helper.make_graph([node], "g", [sample], [out], [weight])), path)
    assert static_input_dims(path) == _onnx_dims(path) == {"sample": (1, 4, 6, 10)}
    layout = SimpleNamespace(model_files={"unet": path}, spec=SimpleNamespace(denoiser="unet"))
    config = PipelineConfig(name="x", vae_scale_factor=8)
    assert fixed_geometry(layout, config) == {"fixed_size": (80, 48)}  # type: ignore[arg-type]
    path.write_bytes(path.read_bytes()[:1000])  # cut inside the initializer
    with pytest.raises(ModelFormatError, match="not a readable ONNX file"):
        static_input_dims(path)


@pytest.mark.parametrize("folder", ["flux_dev", "flux_schnell", "chroma"])
def test_a_fixed_token_graph_sets_the_defaults(folder: str) -> None:
    config = folder_config(read_folder(FLOW / folder))
    assert (config.fixed_size, config.fixed_text_tokens) == ((48, 32), 32)  # 12 x 8 tokens of 4 px: 96
    assert folder_config(read_folder(FLOW / "sd3")).fixed_size is None  # its graph takes any size


@pytest.mark.parametrize("folder", ["flux_dev", "flux_schnell", "chroma", "sd3"])
def test_generate_runs_at_each_flow_folders_default_size(folder: str, tmp_path: Path) -> None:
    """No --width/--height (nor --max-sequence-length): it runs, and gives the image the
    explicit size and token count give."""
    argv = ["generate", "a photo", "--model", str(FLOW / folder), "--steps", "2", "--seed", "3"]
    argv += ["--backend", "reference"]
    assert main([*argv, "-o", str(tmp_path / "default.png")]) == 0
    config = folder_config(read_folder(FLOW / folder))
    width, height = config.fixed_size or (config.default_size, config.default_size)
    explicit = ["--width", str(width), "--height", str(height), "-o", str(tmp_path / "explicit.png")]
    if config.fixed_text_tokens:
        explicit += ["--max-sequence-length", str(config.fixed_text_tokens)]
    assert main([*argv, *explicit]) == 0
    with Image.open(tmp_path / "default.png") as a, Image.open(tmp_path / "explicit.png") as b:
        assert a.size == (width, height)
        assert np.array_equal(np.asarray(a), np.asarray(b))
