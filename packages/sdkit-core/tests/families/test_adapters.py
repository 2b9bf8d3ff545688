"""The LoRA, textual-inversion, standalone-VAE and diffusers-layout fixtures of the tiny families.

The files load with safetensors and have the key layouts ``fixtures/families/README.md``
documents; the documented kohya/PEFT merge rule applied here to the fp16 weights and run on the
reference backend gives diffusers' ``load_lora_weights`` + ``fuse_lora`` outputs (the goldens in
``tiny/<family>/adapters.npz``, written by ``make_adapters.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

import sdkit
from sdkit.families import shipped
from sdkit.model import Model, WeightSet

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
FAMILIES = ("sd1", "sdxl")
KOHYA_KEY = re.compile(r"^(lora_unet|lora_te|lora_te1|lora_te2)_\w+\.(lora_down\.weight|lora_up\.weight|alpha)$")


def _keys(path: Path) -> dict[str, tuple[list[int], str]]:
    with safe_open(str(path), "np") as f:
        return {k: (list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 - safe_open is no dict


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "np") as f:
        return dict(f.metadata() or {})


def _adapters(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TINY / family / "adapters.json").read_text(encoding="utf-8"))
    return data


def _manifests(family: str) -> dict[str, dict[str, list[int]]]:
    meta = json.loads((TINY / family / "goldens.json").read_text(encoding="utf-8"))
    manifests: dict[str, dict[str, list[int]]] = meta["manifests"][family]
    return manifests


@pytest.fixture(autouse=True)
def _fixtures_present(families_dir: Path) -> None:
    if not all((TINY / f / "adapters.json").is_file() for f in FAMILIES):
        pytest.skip("the adapter fixtures are missing (make_adapters.py)")


@pytest.mark.parametrize("family", FAMILIES)
def test_kohya_lora_layout(family: str) -> None:
    manifests = _manifests(family)
    for stem in (f"{family}_kohya_locon", f"{family}_kohya_attn"):
        keys = _keys(TINY / family / "lora" / f"{stem}.safetensors")
        assert [k for k in keys if not KOHYA_KEY.match(k)] == []
        modules = {k.split(".")[0] for k in keys}
        graph_names: dict[str, str] = _adapters(family)["loras"][stem]["graph_names"]
        assert modules == set(graph_names)
        for module, target in graph_names.items():
            component, weight = target.split(":")
            shape = manifests[component][weight]
            down, up = keys[f"{module}.lora_down.weight"][0], keys[f"{module}.lora_up.weight"][0]
            rank = down[0]
            assert down[1:] == shape[1:], module  # a 3x3 conv's down is a 3x3 conv (LoCon)
            assert up == [shape[0], rank, *([1, 1] if len(shape) == 4 else [])], module
            assert keys[f"{module}.alpha"] == ([], "F16")
        assert _metadata(TINY / family / "lora" / f"{stem}.safetensors")["ss_network_module"] == "networks.lora"
    names = set(_adapters(family)["loras"][f"{family}_kohya_locon"]["graph_names"])
    if family == "sd1":  # sd-scripts trains SD 1.x on diffusers module names ...
        assert "lora_unet_down_blocks_1_attentions_0_proj_in" in names
        assert {n.split("_")[1] for n in names} == {"unet", "te"}
    else:  # ... and SDXL on the SGM (LDM) UNet; two text encoders
        assert "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q" in names
        assert "lora_unet_input_blocks_3_0_op" in names  # LoCon on the downsampler
        assert {n.split("_")[1] for n in names} == {"unet", "te1", "te2"}


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_lora_layout(family: str) -> None:
    path = TINY / family / "lora" / f"{family}_peft.safetensors"
    keys = _keys(path)
    manifests = _manifests(family)
    for key, (shape, dtype) in keys.items():
        component, _, rest = key.partition(".")
        module, kind = re.fullmatch(r"(.*)\.(lora_A|lora_B)\.weight", rest).groups()  # type: ignore[union-attr]
        # CLIPTextModel is flattened in transformers >= 5.6 (no "text_model."); the
        # WithProjection model (SDXL's bigG) is not: the graph name has it either way
        flat = component == "unet" or module.startswith(("text_model.", "text_projection"))
        name = (module if flat else "text_model." + module) + ".weight"
        assert name in manifests[component], key
        assert dtype == "F16" and shape[0 if kind == "lora_A" else 1] == 4
    metadata = json.loads(_metadata(path)["lora_adapter_metadata"])
    assert metadata["unet.r"] == 4 and metadata["unet.lora_alpha"] == 8
    legacy = _keys(TINY / family / "lora" / f"{family}_peft_text_model.safetensors")

    def flat(key: str) -> str:
        return re.sub(r"^(text_encoder(_2)?)\.text_model\.", r"\1.", key)

    assert {flat(k) for k in legacy} == {flat(k) for k in keys} and len(legacy) == len(keys)
    assert all(k.startswith(("unet.", "text_encoder.text_model.", "text_encoder_2.text_model.")) for k in legacy)


def test_embedding_layouts() -> None:
    assert _keys(TINY / "sd1" / "embeddings" / "skstyle.safetensors") == {"emb_params": ([3, 32], "F16")}
    assert _keys(TINY / "sd1" / "embeddings" / "skcat.safetensors") == {"string_to_param.*": ([1, 32], "F16")}
    assert _keys(TINY / "sdxl" / "embeddings" / "skxlstyle.safetensors") == {
        "clip_l": ([2, 32], "F16"),
        "clip_g": ([2, 48], "F16"),
    }


def test_standalone_vae_layouts() -> None:
    manifests = _manifests("sd1")
    graph = {**manifests["vae_encoder"], **manifests["vae_decoder"]}
    diffusers_keys = _keys(TINY / "sd1" / "vae" / "vae_diffusers_fp16.safetensors")
    assert {k: v[0] for k, v in diffusers_keys.items()} == graph
    ldm = _keys(TINY / "sd1" / "vae" / "vae_ldm_fp16.safetensors")
    assert len(ldm) == len(graph) and not [k for k in ldm if k.startswith("first_stage_model.")]
    assert ldm["encoder.mid.attn_1.q.weight"][0] == [16, 16, 1, 1]  # a 1x1 conv; the graph's is [16, 16]
    assert ldm["decoder.up.1.upsample.conv.weight"][0] == graph["decoder.up_blocks.0.upsamplers.0.conv.weight"]


@pytest.mark.parametrize("family", FAMILIES)
def test_diffusers_layout_single_file(family: str) -> None:
    manifests = _manifests(family)
    keys = _keys(TINY / family / f"{family}_diffusers_fp16.safetensors")
    by_part: dict[str, dict[str, list[int]]] = {}
    for key, (shape, _) in keys.items():
        part, _, name = key.partition(".")
        by_part.setdefault(part, {})[name] = shape
    expected = {k: v for k, v in manifests.items() if not k.startswith("vae_")}
    expected["vae"] = {**manifests["vae_encoder"], **manifests["vae_decoder"]}
    assert by_part == expected


# --- the documented merge rule against diffusers' fused outputs ------------------------------------


def merged_unet(family: str, loras: list[tuple[str, float]]) -> dict[str, np.ndarray]:
    """W + strength * alpha / rank * up @ down (kohya; convs contracted over the rank) and
    W + strength * lora_alpha / r * B @ A (PEFT), in float32, on the fp16 file's UNet."""
    weights = _fp32(TINY / family / "weights" / "unet.safetensors")
    meta = _adapters(family)["loras"]
    for stem, strength in loras:
        tensors = _fp32(TINY / family / "lora" / f"{stem}.safetensors")
        if "graph_names" in meta[stem] and isinstance(meta[stem]["graph_names"], dict):  # kohya
            for module, target in meta[stem]["graph_names"].items():
                component, name = target.split(":")
                if component != "unet":
                    continue
                down, up = tensors[f"{module}.lora_down.weight"], tensors[f"{module}.lora_up.weight"]
                scale = float(tensors[f"{module}.alpha"]) / down.shape[0]
                weights[name] = weights[name] + strength * scale * _product(up, down)
        else:  # PEFT: the scale is in the file's metadata, per component (no alpha_pattern here)
            config = json.loads(_metadata(TINY / family / "lora" / f"{stem}.safetensors")["lora_adapter_metadata"])
            scale = config["unet.lora_alpha"] / config["unet.r"]
            for key, a in tensors.items():
                if key.startswith("unet.") and key.endswith(".lora_A.weight"):
                    b = tensors[key.replace(".lora_A.", ".lora_B.")]
                    name = key[len("unet.") : -len(".lora_A.weight")] + ".weight"
                    weights[name] = weights[name] + strength * scale * _product(b, a)
    return weights


def _fp32(path: Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float32) for k, v in WeightSet.load_safetensors(path).items()}


def _product(up: np.ndarray, down: np.ndarray) -> np.ndarray:
    if down.ndim == 2:
        return up @ down
    return np.einsum("or,rihw->oihw", up.reshape(up.shape[0], -1), down)


@pytest.mark.parametrize(
    ("family", "case"),
    [
        ("sd1", "sd1_kohya_locon@0.5"),
        ("sd1", "sd1_kohya_locon@1.0+sd1_peft@0.5"),
        ("sdxl", "sdxl_kohya_locon@0.5"),
        ("sdxl", "sdxl_peft@1.0"),
    ],
)
def test_lora_merge_rule_equals_diffusers(family: str, case: str) -> None:
    loras = [(part.split("@")[0], float(part.split("@")[1])) for part in case.split("+")]
    graph = shipped.load_graph(TINY / family / "graphs" / "unet.onnx")
    compiled = sdkit.compile(Model(graph, WeightSet(merged_unet(family, loras))), backend="reference")
    with np.load(TINY / family / "adapters.npz", allow_pickle=False) as goldens:
        prefix = f"{family}/inputs/unet/"
        feeds = {k[len(prefix) :]: goldens[k] for k in goldens.files if k.startswith(prefix)}
        expected = goldens[f"lora/{case}/unet/out_sample"]
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as base:
        assert np.abs(expected - base[f"{family}_fp16/unet/out_sample"]).max() > 1e-2  # the LoRA matters
    np.testing.assert_allclose(compiled.run(feeds)["out_sample"], expected, rtol=0, atol=1e-4)
