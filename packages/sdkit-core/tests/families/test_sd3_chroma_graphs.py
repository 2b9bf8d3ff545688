"""The shipped full-size SD3 / SD 3.5 MMDiT and Chroma transformer graphs
(``fixtures/families/export_sd3_chroma_graphs.py``): their inputs and dynamic dimensions, their
depth and block kinds, that the families' probes are theirs, and that every initializer of each is
found, with its shape, in a header-only file of the published architecture (no key unread).

Numerics are checked at export (onnxruntime on the graph vs diffusers in torch with random
weights, at two batches, image sizes and text lengths other than the trace's, at reduced depth
full width and at full depth reduced width; the numbers in ``fixtures/families/VERSIONS.json``):
an 8B-weight graph does not run in a test.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

import sdkit.families.chroma as chroma
import sdkit.families.sd3 as sd3
from sdkit.families import Checkpoint, Family, shipped
from sdkit.families.family import initializer_specs


def _single_file_tests() -> Any:
    """The header-only writers and key lists of ``test_sd3_chroma_single_file.py`` (pytest's
    importlib mode puts no test folder on ``sys.path``)."""
    path = Path(__file__).with_name("test_sd3_chroma_single_file.py")
    spec = importlib.util.spec_from_file_location("sd3_chroma_single_file_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_KEYS = _single_file_tests()
chroma_keys, header_only, sd3_keys = _KEYS.chroma_keys, _KEYS.header_only, _KEYS.sd3_keys
SD3_GRAPHS = {
    "sd3_medium_transformer": (sd3.SD3_MEDIUM, sd3.SD3_MEDIUM_ARCH),
    "sd35_large_transformer": (sd3.SD35_LARGE, sd3.SD35_LARGE_ARCH),
    "sd35_medium_transformer": (sd3.SD35_MEDIUM, sd3.SD35_MEDIUM_ARCH),
}
# Every graph export_sd3_chroma_graphs.py writes (all shipped).
GRAPHS = ["sd3_medium_transformer", "sd35_large_transformer", "sd35_medium_transformer", "chroma_transformer"]
BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")


def family_of(name: str) -> Family:
    return SD3_GRAPHS[name][0] if name in SD3_GRAPHS else chroma.CHROMA


def dims(graph_name: str) -> dict[str, list[int | str]]:
    graph = shipped.load_graph(graph_name)
    return {i.name: list(i.shape) for i in [*graph.inputs, *graph.outputs]}


def blocks(graph_name: str) -> dict[tuple[str, int], dict[str, tuple[int, ...]]]:
    found: dict[tuple[str, int], dict[str, tuple[int, ...]]] = {}
    for t in shipped.load_graph(graph_name).proto.graph.initializer:
        match = BLOCK.match(t.name)
        if match:
            kind, index, rest = match.groups()
            found.setdefault((kind, int(index)), {})[rest] = tuple(t.dims)
    return found


@pytest.mark.parametrize("name", GRAPHS)
def test_transformer_inputs_are_dynamic(name: str) -> None:
    """Batch, latent height/width (SD3) or image tokens (Chroma) and text tokens are named
    dimensions: any resolution, any prompt length."""
    found = dims(name)
    if name in SD3_GRAPHS:
        image: list[int | str] = ["batch", 16, "height", "width"]
        expected: dict[str, list[int | str]] = {
            "hidden_states": image,
            "encoder_hidden_states": ["batch", "text_tokens", 4096],
            "pooled_projections": ["batch", 2048],
            "timestep": ["batch"],
            "out_hidden_states": image,
        }
        found["out_hidden_states"][1] = 16  # the exporter names it (the unpatchify Reshape's), 16 at run time
    else:
        expected = {
            "hidden_states": ["batch", "image_tokens", 64],
            "encoder_hidden_states": ["batch", "text_tokens", 4096],
            "timestep": ["batch"],
            "img_ids": ["image_tokens", 3],
            "txt_ids": ["text_tokens", 3],
            "attention_mask": ["batch", "tokens"],
            "out_hidden_states": ["batch", "image_tokens", 64],
        }
    assert found == expected


@pytest.mark.parametrize("name", [n for n in GRAPHS if n in SD3_GRAPHS])
def test_sd3_depth_and_block_kinds(name: str) -> None:
    """The published depth; the MMDiT-X blocks (``attn2``) exactly SD 3.5 Medium's 0-12; the last
    block context-pre-only (no ``attn.to_add_out``, no ``ff_context``); the others alike."""
    arch = SD3_GRAPHS[name][1]
    found = blocks(name)
    assert sorted(i for _, i in found) == list(range(arch.depth))
    dual = {i for (_, i), params in found.items() if "attn2.to_q.weight" in params}
    assert dual == set(arch.dual_attention_layers)
    last = found[("transformer_blocks", arch.depth - 1)]
    assert not any(k.startswith(("attn.to_add_out.", "ff_context.")) for k in last)
    for (_, i), params in found.items():
        if i < arch.depth - 1:  # like the first block of its kind
            assert params == found[("transformer_blocks", min(dual if i in dual else set(range(i + 1)) - dual))]
    graph = shipped.load_graph(name)
    table = next(t for t in graph.proto.graph.initializer if t.name == "pos_embed.pos_embed")
    assert tuple(table.dims) == (1, arch.positions, arch.hidden)  # the files' table, read as a weight


@pytest.mark.parametrize("name", GRAPHS)
def test_family_probes_are_graph_initializers(name: str) -> None:
    """Detection's probe shapes are the shipped graph's (the families read these graphs)."""
    spec = family_of(name).components["transformer"]
    assert spec.graph == name
    inits = {t.name: tuple(t.dims) for t in spec.load_graph().proto.graph.initializer}
    assert {k: inits.get(k) for k in spec.probes} == dict(spec.probes)


@pytest.mark.parametrize("name", GRAPHS)
def test_every_initializer_maps_from_the_full_size_file(tmp_path: Path, families_dir: Path, name: str) -> None:
    """The graph's initializers are diffusers' module's parameters (``manifest.json``, from its
    state dict at export); a header-only file of the published architecture (Stability's MMDiT
    keys, lodestones' Chroma keys; bf16) is detected as its family, and each initializer is found
    in it with its shape; no key of the file is left unread."""
    family = family_of(name)
    shapes = sd3_keys(SD3_GRAPHS[name][1]) if name in SD3_GRAPHS else chroma_keys()
    checkpoint = Checkpoint.open(header_only(tmp_path / f"{name}.safetensors", shapes))
    layout = family.detect(checkpoint)
    assert layout is not None
    used = set()
    specs = initializer_specs(shipped.load_graph(name))
    for init, (shape, _) in specs.items():
        source = family.key_map_entry("transformer", layout, init, shape)
        key = checkpoint.find(source)
        assert key is not None, init
        assert source.stored_shape_fits(checkpoint.entry(key).shape, shape), init
        used.add(key)
    assert used == set(checkpoint), sorted(set(checkpoint) - used)[:5]
    manifest = json.loads((families_dir / "manifest.json").read_text(encoding="utf-8"))[name]
    assert {k: list(shape) for k, (shape, _) in specs.items()} == manifest


@pytest.mark.parametrize("name", GRAPHS)
def test_transformer_graph_is_lean(name: str) -> None:
    """Weightless and one Constant node per value (the per-block LayerNorm ones/zeros shared)."""
    graph = shipped.load_graph(name)
    constants = [n.attribute[0].SerializeToString() for n in graph.proto.graph.node if n.op_type == "Constant"]
    assert len(constants) == len(set(constants))
    assert len(shipped.graph_bytes(name)) < 3_000_000  # the ONNX, uncompressed
