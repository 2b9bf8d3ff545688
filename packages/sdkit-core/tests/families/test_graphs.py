"""The shipped weightless graphs and the tiny family graphs against their contract and goldens.

Oracles: the state-dict manifests written by the export scripts from the torch modules
(``fixtures/families/manifest.json``, ``tiny/goldens.json``), ``onnx.checker``, and the outputs
of the diffusers modules that ``from_single_file`` loaded (``tiny/goldens.npz``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.families import shipped
from sdkit.model import Model, WeightSet

SHIPPED = shipped.names()


def checkable(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with its weightless initializers as typed graph inputs (the checker would
    otherwise look for the data)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for t in proto.graph.initializer:
        copy.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del copy.graph.initializer[:]
    return copy


@pytest.fixture(scope="module")
def versions(families_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((families_dir / "VERSIONS.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def manifest(families_dir: Path) -> dict[str, dict[str, list[int]]]:
    data: dict[str, dict[str, list[int]]] = json.loads((families_dir / "manifest.json").read_text(encoding="utf-8"))
    return data


def assert_contract(proto: onnx.ModelProto, expected: dict[str, list[int]], buffers: Sequence[str] = ()) -> None:
    """The initializers are the state dict's, weightless; no large Constant (a folded weight)
    but the module's own ``buffers`` that no file holds (Chroma's ``mod_proj``)."""
    inits = {t.name: list(t.dims) for t in proto.graph.initializer}
    assert sorted(set(inits) ^ set(expected)) == []
    assert {k: v for k, v in inits.items() if v != expected[k]} == {}
    for t in proto.graph.initializer:
        assert t.data_type == TensorProto.FLOAT, t.name
        assert t.data_location == TensorProto.EXTERNAL and not t.raw_data, t.name
        assert {e.key: e.value for e in t.external_data} == {"location": "sdkit:weightset"}, t.name
    large = [n.name for n in proto.graph.node if n.op_type == "Constant" and _elements(n) >= 4096]
    assert [n for n in large if n.removeprefix("const_") not in buffers] == []


def _elements(node: onnx.NodeProto) -> int:
    return max((int(np.prod(a.t.dims)) for a in node.attribute if a.name == "value"), default=0)


def test_every_exported_graph_is_shipped(versions: dict[str, Any]) -> None:
    assert set(SHIPPED) == set(versions["graphs"])


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_graph_contract(name: str, manifest: dict[str, dict[str, list[int]]], versions: dict[str, Any]) -> None:
    graph = shipped.load_graph(name)
    facts = versions["graphs"][name]
    assert_contract(graph.proto, manifest[name], facts.get("non_persistent_buffers", ()))
    assert graph.opset() == 17
    assert [i.name for i in graph.inputs] == facts["inputs"]
    assert [o.name for o in graph.outputs] == facts["outputs"]
    assert all(isinstance(i.shape[0], str) for i in graph.inputs)  # dynamic batch
    onnx.checker.check_model(checkable(graph.proto))


def test_text_encoder_outputs(versions: dict[str, Any]) -> None:
    """Every layer's hidden state is an output: SDXL reads the penultimate (hidden_states.N-1)."""
    for name, layers, pooled in (
        ("clip_l", 12, "pooler_output"),
        ("openclip_h", 23, "pooler_output"),
        ("openclip_bigg", 32, "text_embeds"),
    ):
        outputs = versions["graphs"][name]["outputs"]
        assert pooled in outputs and "last_hidden_state" in outputs
        assert [o for o in outputs if o.startswith("hidden_states.")] == [
            f"hidden_states.{i}" for i in range(layers + 1)
        ]


NAMED = [
    ("sd1_unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight", [320, 320]),
    ("clip_l", "text_model.encoder.layers.0.self_attn.q_proj.weight", [768, 768]),
    ("openclip_bigg", "text_projection.weight", [1280, 1280]),
    ("vae_decoder", "decoder.mid_block.attentions.0.to_q.weight", [512, 512]),
    ("vae_decoder", "post_quant_conv.weight", [4, 4, 1, 1]),
    ("sdxl_unet", "add_embedding.linear_1.weight", [1280, 2816]),
    ("sd1_inpaint_unet", "conv_in.weight", [320, 9, 3, 3]),
    ("sd1_unet", "down_blocks.0.attentions.0.proj_in.weight", [320, 320, 1, 1]),  # SD 1.x: 1x1 conv
    ("sd2_unet", "down_blocks.0.attentions.0.proj_in.weight", [320, 320]),  # SD 2.x: Linear
    ("sd2_unet", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", [320, 1024]),
    ("sdxl_unet", "down_blocks.2.attentions.1.transformer_blocks.9.attn2.to_k.weight", [1280, 2048]),
    ("sdxl_inpaint_unet", "conv_in.weight", [320, 9, 3, 3]),
    ("sdxl_refiner_unet", "add_embedding.linear_1.weight", [1536, 2560]),
    ("sdxl_refiner_unet", "down_blocks.1.attentions.0.transformer_blocks.3.attn2.to_k.weight", [768, 1280]),
    ("openclip_h", "text_model.encoder.layers.22.mlp.fc1.weight", [4096, 1024]),
]


@pytest.mark.parametrize(("graph", "name", "shape"), NAMED)
def test_shipped_graph_names_are_state_dict_names(
    graph: str, name: str, shape: list[int], manifest: dict[str, dict[str, list[int]]]
) -> None:
    if graph not in SHIPPED:
        pytest.skip(f"{graph} has not been exported")
    assert manifest[graph][name] == shape
    assert list(next(t.dims for t in shipped.load_graph(graph).proto.graph.initializer if t.name == name)) == shape


def test_unknown_graph_name_is_one_clear_error() -> None:
    with pytest.raises(sdkit.errors.ModelFormatError, match="no shipped graph"):
        shipped.load_graph("sd9_unet")


# --- tiny families -------------------------------------------------------------------------


TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"


def _meta(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TINY / family / "goldens.json").read_text(encoding="utf-8"))
    return data


def _goldens(family: str) -> dict[str, np.ndarray]:
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _tiny_cases() -> list[tuple[str, str]]:
    """(family, component) for every family folder with goldens (each family has its own pair of
    golden files, so ``make_checkpoints.py <family>`` regenerates one alone)."""
    cases = []
    for path in sorted(TINY.glob("*/goldens.json")):
        meta = json.loads(path.read_text(encoding="utf-8"))
        cases += [(family, comp) for family, graphs in meta["manifests"].items() for comp in graphs]
    return cases


def test_tiny_families_are_all_there() -> None:
    assert {family for family, _ in _tiny_cases()} == {"sd1", "sd2v", "sd1_inpaint", "sdxl", "sdxl_refiner"}


@pytest.mark.parametrize(("family", "component"), _tiny_cases())
def test_tiny_graph_on_reference_equals_diffusers(family: str, component: str, families_dir: Path) -> None:
    folder = families_dir / "tiny" / family
    meta, goldens = _meta(family), _goldens(family)
    graph = shipped.load_graph(folder / "graphs" / f"{component}.onnx")
    assert_contract(graph.proto, meta["manifests"][family][component])
    weights = WeightSet.load_safetensors(folder / "weights" / f"{component}.safetensors")
    fp32 = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}  # the fp16 file's values, exactly
    compiled = sdkit.compile(Model(graph, WeightSet(fp32)), backend="reference")
    prefix = f"{family}/inputs/{component}/"
    feeds = {k[len(prefix) :]: v for k, v in goldens.items() if k.startswith(prefix)}
    outputs = compiled.run(feeds)
    golden_prefix = f"{family}_fp16/{component}/"
    expected = {k[len(golden_prefix) :]: v for k, v in goldens.items() if k.startswith(golden_prefix)}
    assert set(expected) == {o.name for o in graph.outputs}
    for name, value in expected.items():
        np.testing.assert_allclose(outputs[name], value, rtol=0, atol=1e-4, err_msg=f"{family}/{component}/{name}")


def test_tiny_single_files_are_described() -> None:
    """Each family's files exist with the recorded sizes; v-prediction files carry A1111's .yaml."""
    for path in sorted(TINY.glob("*/goldens.json")):
        family = path.parent.name
        facts = _meta(family)["families"][family]
        for stem, record in facts["files"].items():
            file = path.parent / f"{stem}.safetensors"
            assert file.stat().st_size == record["bytes"], stem
            yaml = file.with_suffix(".yaml")
            if facts["prediction_type"] == "v_prediction":
                assert 'parameterization: "v"' in yaml.read_text(encoding="utf-8"), stem
            else:
                assert not yaml.exists(), stem
