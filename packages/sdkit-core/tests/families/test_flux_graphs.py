"""The shipped full-size FLUX.1 graphs (``fixtures/families/export_flux_graphs.py``): their
inputs and dynamic dimensions, their depth, and what the Flux families read from them.

Numerics are checked at export (onnxruntime on the graph vs diffusers/transformers in torch with
random weights, at another batch, image size and text length than the trace; the numbers in
``fixtures/families/VERSIONS.json``): a 12B-weight graph does not run in a test.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.families import shipped
from sdkit.families.flux import FLUX, FLUX_DEV, FLUX_SCHNELL
from sdkit.model import Model, WeightSet

TRANSFORMERS = ["flux_dev_transformer", "flux_schnell_transformer"]
BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")


def dims(graph_name: str) -> dict[str, list[int | str]]:
    graph = shipped.load_graph(graph_name)
    return {i.name: list(i.shape) for i in [*graph.inputs, *graph.outputs]}


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_inputs_are_dynamic(name: str) -> None:
    """Batch, image tokens and text tokens are named dimensions (any resolution, any T5 length);
    dev alone has the guidance input."""
    found = dims(name)
    expected: dict[str, list[int | str]] = {
        "hidden_states": ["batch", "image_tokens", 64],
        "encoder_hidden_states": ["batch", "text_tokens", 4096],
        "pooled_projections": ["batch", 768],
        "timestep": ["batch"],
        "img_ids": ["image_tokens", 3],
        "txt_ids": ["text_tokens", 3],
        "out_hidden_states": ["batch", "image_tokens", 64],
    }
    if name == "flux_dev_transformer":
        expected["guidance"] = ["batch"]
    assert found == expected


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_has_flux_depth_and_identical_blocks(name: str) -> None:
    """19 double and 38 single blocks, each with the same parameters (block 0's names and shapes)."""
    graph = shipped.load_graph(name)
    blocks: dict[tuple[str, int], dict[str, tuple[int, ...]]] = {}
    for t in graph.proto.graph.initializer:
        match = BLOCK.match(t.name)
        if match:
            kind, index, rest = match.groups()
            blocks.setdefault((kind, int(index)), {})[rest] = tuple(t.dims)
    counts = Counter(kind for kind, _ in blocks)
    assert counts == {"transformer_blocks": FLUX.double_blocks, "single_transformer_blocks": FLUX.single_blocks}
    for (kind, _), params in blocks.items():
        assert params == blocks[(kind, 0)]
    scopes = {
        m.group(1)
        for n in graph.proto.graph.node
        if (m := re.match(r"^/((?:single_)?transformer_blocks\.\d+)/", n.name))
    }
    assert len(scopes) == FLUX.double_blocks + FLUX.single_blocks  # every block has its own nodes


@pytest.mark.parametrize("family", [FLUX_DEV, FLUX_SCHNELL], ids=lambda f: f.name)
def test_family_probes_are_graph_initializers(family: object) -> None:
    """Detection's probe shapes are the shipped graph's (the families read these graphs)."""
    spec = family.components["transformer"]  # type: ignore[attr-defined]
    graph = spec.load_graph()
    inits = {t.name: tuple(t.dims) for t in graph.proto.graph.initializer}
    assert {k: inits.get(k) for k in spec.probes} == dict(spec.probes)
    assert ("time_text_embed.guidance_embedder.linear_1.weight" in inits) == (family is FLUX_DEV)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_graph_is_lean(name: str) -> None:
    """Weightless and one Constant node per value (the per-block LayerNorm ones/zeros shared)."""
    graph = shipped.load_graph(name)
    constants = [n.attribute[0].SerializeToString() for n in graph.proto.graph.node if n.op_type == "Constant"]
    assert len(constants) == len(set(constants))
    assert len(shipped.graph_bytes(name)) < 3_000_000  # the ONNX, uncompressed


TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "flux_dynamic"


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_assembled_graph_runs_at_two_sizes(backend: str) -> None:
    """The shipped graphs' export and depth assembly (``export_flux_graphs.py --tiny``: the dev
    transformer at width 32, traced at 2 + 2 blocks, assembled to 3 + 4) on sdkit's backends: at
    the trace's size (batch 1, 24 image / 12 text tokens) and another (batch 2, 60 / 17), diffusers'
    ``FluxTransformer2DModel`` of that depth, same fp16-stored weights, within 1e-4."""
    found = next((b for b in sdkit.backends() if b.name == backend), None)
    if found is None or not found.available:
        pytest.skip(f"backend {backend} unavailable")
    graph = shipped.load_graph(TINY / "transformer.onnx")
    weights = {
        k: np.asarray(v, np.float32) for k, v in WeightSet.load_safetensors(TINY / "weights.safetensors").items()
    }
    options = {"threads": 1} if backend == "ggml" else {}
    with np.load(TINY / "golden.npz") as data:
        golden = {k: data[k] for k in data.files}
    for size in ("small", "other"):
        feeds = {k.rpartition("/")[2]: v for k, v in golden.items() if k.startswith(f"{size}/inputs/")}
        compiled = sdkit.compile(Model(graph, WeightSet(weights)), backend=backend, **options)
        out = compiled.run(feeds)["out_hidden_states"]
        diff = float(np.abs(out - golden[f"{size}/output"]).max())
        print(f"{backend} {size} {tuple(out.shape)}: max |diff| {diff:.3g}")
        assert diff <= 1e-4, (size, diff)
