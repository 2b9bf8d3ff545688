"""GFPGAN files: configuration detected from keys and shapes only, held to spandrel's module
(``fixtures/faces/gfpgan/goldens.json``: every key and shape of spandrel's ``GFPGANv1Clean`` state
dict, v1.4's loaded by spandrel's own detection as GFPGAN), and refused clearly when they are not
one. Header-only files: nothing is allocated or read but the header.

The numbers (sdkit's backends vs spandrel's outputs) are in ``tests/pipelines/test_gfpgan.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdkit.errors import ModelFormatError
from sdkit.families import gfpgan
from sdkit.families.gfpgan import GFPGANConfig, GFPGANFile, find_graph, sniff
from sdkit.testing.safetensors_files import write_header_only_safetensors

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "fixtures" / "faces" / "gfpgan"
RECORD: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())
GOLDENS: dict[str, Any] = RECORD["cases"]
V14 = GFPGANConfig(512, 512, 2, 512, num_mlp=8)


def header_only(path: Path, entries: list[tuple[str, list[int]]]) -> Path:
    return write_header_only_safetensors(path, dict(entries), "F32")


def shapes(case: str, prefix: str = "") -> dict[str, tuple[int, ...]]:
    return {prefix + k: tuple(s) for k, s in GOLDENS[case]["entries"]}


def test_v14_is_read_from_its_shapes() -> None:
    """spandrel's v1.4 state dict (which spandrel's ModelLoader detected as GFPGAN), shapes only."""
    assert GOLDENS["full_v14_stored"]["spandrel_architecture"] == "GFPGAN"
    config = sniff(shapes("full_v14_stored"))
    assert config == V14
    assert config.graph_name == "gfpgan_v1clean_512px_ch512x2_w512"
    assert config.layers == 15 and [s[2] for s in config.noise_shapes()][:4] == [4, 8, 8, 16]
    for prefix in ("params_ema.", "params.", "module."):
        assert sniff(shapes("full_v14_stored", prefix)) == V14
    tiny = sniff(shapes("tiny_stored"))
    built = GOLDENS["tiny_stored"]["config"]
    assert tiny is not None and (tiny.size, tiny.style_width, tiny.channel_multiplier, tiny.num_mlp) == (
        built["out_size"],
        built["num_style_feat"],
        built["channel_multiplier"],
        built["num_mlp"],
    )
    assert tiny.width == int(512 * built["narrow"])


@pytest.mark.parametrize("foreign", ["codeformer", "restoreformer", "gfpgan_v1_original"])
def test_other_face_models_are_not_gfpgan(foreign: str) -> None:
    """CodeFormer, RestoreFormer, and the original GFPGANv1 (spandrel's detection keys, compiled
    StyleGAN2 layout: spandrel would call it GFPGAN and fail to load it) are not read."""
    entries = RECORD["foreign"][foreign]
    assert sniff({k: tuple(s) for k, s in entries}) is None


def test_upscalers_and_odd_shapes_are_not_gfpgan() -> None:
    upscalers = json.loads((ROOT / "fixtures" / "upscalers" / "goldens.json").read_text())["cases"]
    for case in ("full_x4plus", "full_general_x4v3"):
        assert sniff({k: tuple(s) for k, s in upscalers[case]["entries"]}) is None
    assert sniff({}) is None
    v14 = shapes("full_v14_stored")
    assert sniff({k: v for k, v in v14.items() if k != "conv_body_first.weight"}) is None
    assert sniff({k: v for k, v in v14.items() if not k.startswith("conv_body_down.6.")}) is None
    assert sniff({**v14, "final_linear.weight": (1000, 8192)}) is None
    assert sniff({**v14, "stylegan_decoder.constant_input.weight": ()}) is None  # never raises
    assert sniff({**v14, "condition_scale.0.2.weight": (3, 256, 3, 3)}) is None
    # one style for all layers, SFT on all channels: read, and named (no graph ships for them)
    same_w = sniff({**v14, "final_linear.weight": (512, 8192)})
    assert same_w is not None and not same_w.different_w and same_w.graph_name.endswith("_samew")
    full_sft = sniff({**v14, "condition_scale.0.2.weight": (512, 256, 3, 3)})
    assert full_sft is not None and not full_sft.sft_half


def test_the_shipped_graph_takes_every_v14_tensor_it_uses(tmp_path: Path) -> None:
    """A header-only v1.4 file (params_ema. prefix as GFPGAN's releases hold it once converted):
    every graph initializer found with its shape; toRGB, style_mlp and the noise buffers left out."""
    entries = [(f"params_ema.{k}", s) for k, s in GOLDENS["full_v14_stored"]["entries"]]
    file = GFPGANFile(header_only(tmp_path / "GFPGANv1.4.safetensors", entries))
    graph = find_graph(file.config)
    assert [i.name for i in graph.inputs] == ["image", *(f"noise{i}" for i in range(15))]
    specs = {t.name: tuple(int(d) for d in t.dims) for t in graph.proto.graph.initializer}
    held = {k: tuple(e.shape) for k, e in file.entries().items()}
    assert all(held[k] == s for k, s in specs.items())
    left = set(held) - set(specs)
    assert left and all(k.startswith(gfpgan.UNUSED_PREFIXES) for k in left)
    assert [n.shape for n in file.stored_noise()] == file.config.noise_shapes()
    file.close()
    assert gfpgan.gfpgan_graph_names() == ["gfpgan_v1clean_512px_ch512x2_w512"]


def test_pickles_are_refused_unread_with_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "GFPGANv1.4.pth"
    path.write_bytes(b"\x80\x02 never read")
    with pytest.raises(ModelFormatError, match=r"weights_only=True.*params_ema.*GFPGANv1\.4\.safetensors"):
        GFPGANFile(path)
    renamed = tmp_path / "renamed.safetensors"
    renamed.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ModelFormatError, match="pickle"):
        GFPGANFile(renamed)


def test_foreign_or_unfitting_files_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not found"):
        GFPGANFile(tmp_path / "missing.safetensors")
    codeformer = [(k, s) for k, s in RECORD["foreign"]["codeformer"]]
    with pytest.raises(ModelFormatError, match="not a GFPGAN v1 clean file"):
        GFPGANFile(header_only(tmp_path / "codeformer.safetensors", codeformer))
    tiny = GFPGANFile(header_only(tmp_path / "tiny.safetensors", GOLDENS["tiny_stored"]["entries"]))
    with pytest.raises(ModelFormatError, match=r"no graph for GFPGAN v1 clean 64 px.*export_gfpgan_graphs"):
        find_graph(tiny.config)
    tiny.close()
    extra = [*GOLDENS["tiny_stored"]["entries"], ("arcface.fc.weight", [4, 4])]
    odd = GFPGANFile(header_only(tmp_path / "odd.safetensors", extra))
    with pytest.raises(ModelFormatError, match=r"unexpected \['arcface.fc.weight'\]"):
        odd.weights(find_graph(odd.config, [FIXTURES / "tiny"]))
    odd.close()
    quiet = [(k, s) for k, s in GOLDENS["tiny_stored"]["entries"] if ".noises." not in k]
    file = GFPGANFile(header_only(tmp_path / "quiet.safetensors", quiet))
    with pytest.raises(ModelFormatError, match="noise='random'"):
        file.stored_noise()
    file.close()
