"""Mapping a checkpoint onto a family: every tiny file (LDM/SGM and diffusers layouts, fp32, fp16,
bf16, EMA) fills every graph initializer with the right values, and a file that does not fit is
one clear error naming the keys.

Oracles: ``tiny/<family>/weights/<component>.safetensors``, the fp16 file's values under the graph
names written by the fixture script, whose files diffusers' ``from_single_file`` loads back to
exactly those weights (``goldens.json``); the bf16 files are checked against ``ml_dtypes``'
rounding of the same values, and their component outputs against diffusers' goldens.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.families import Checkpoint, Family, UnusedKeysWarning, detect
from sdkit.model import Model, WeightSet

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"


FILES = [
    ("sd1", "sd1_fp32", "ldm"),
    ("sd1", "sd1_fp16", "ldm"),
    ("sd1", "sd1_bf16", "ldm"),
    ("sd1", "sd1_ema_fp16", "ldm"),
    ("sd1", "sd1_diffusers_fp16", "diffusers"),
    ("sd2v", "sd2v_fp16", "ldm"),
    ("sd2v", "sd2v_bf16", "ldm"),
    ("sd1_inpaint", "sd1_inpaint_fp16", "ldm"),
    ("sd1_inpaint", "sd1_inpaint_bf16", "ldm"),
    ("sdxl", "sdxl_fp16", "ldm"),
    ("sdxl", "sdxl_bf16", "ldm"),
    ("sdxl", "sdxl_diffusers_fp16", "diffusers"),
    ("sdxl_refiner", "sdxl_refiner_fp16", "ldm"),
]


def _expected(family: str, component: str) -> dict[str, np.ndarray]:
    """The graph-named fp16 values of the family's fp16 file."""
    base = WeightSet.load_safetensors(TINY / family / "weights" / f"{component}.safetensors")
    return {k: np.asarray(v) for k, v in base.items()}


def _check_values(got: np.ndarray, fp16: np.ndarray, dtype: str, what: str) -> None:
    """The fp16 file holds the fp32 values rounded to fp16, the bf16 file rounded to bf16."""
    assert got.dtype == np.float32 and got.shape == fp16.shape, what
    if dtype == "fp16":
        np.testing.assert_array_equal(got, fp16.astype(np.float32), err_msg=what)
    elif dtype == "fp32":
        np.testing.assert_array_equal(got.astype(np.float16), fp16, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(ml_dtypes.bfloat16).astype(np.float32), got, err_msg=what)
        np.testing.assert_allclose(got, fp16.astype(np.float32), rtol=2**-8 + 2**-11, atol=1e-7, err_msg=what)


@pytest.mark.parametrize(("family", "file", "layout"), FILES)
def test_every_file_maps_every_initializer(
    tiny_families: dict[str, Family], family: str, file: str, layout: str
) -> None:
    checkpoint = Checkpoint.open(TINY / family / f"{file}.safetensors")
    found = detect(checkpoint, list(tiny_families.values()))
    assert (found.family.name, found.layout) == (f"tiny_{family}", layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no key left unread (EMA copies and buffers are known)
        mapped = found.family.map(checkpoint, found.layout)
    dtype = file.rpartition("_")[2]
    for component, weights in mapped.weights.items():
        graph = found.family.components[component].load_graph()
        assert set(weights) == graph.initializer_names
        assert all(weights.is_lazy(name) for name in weights)
        for name, value in _expected(family, component).items():
            _check_values(weights[name], value, dtype, f"{file}: {component}/{name}")


def _goldens(family: str) -> dict[str, np.ndarray]:
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize(
    ("family", "file", "component"),
    [
        ("sd1_inpaint", "sd1_inpaint_fp16", "unet"),
        ("sd1_inpaint", "sd1_inpaint_bf16", "unet"),
        ("sdxl", "sdxl_bf16", "unet"),
        ("sdxl", "sdxl_fp16", "text_encoder_2"),
        ("sdxl_refiner", "sdxl_refiner_fp16", "unet"),
    ],
)
def test_mapped_component_equals_diffusers(
    tiny_families: dict[str, Family], family: str, file: str, component: str
) -> None:
    """Each family's components (inpainting and SDXL ones too), run on the reference backend
    with the mapped weights, give diffusers' outputs for the same file."""
    checkpoint = Checkpoint.open(TINY / family / f"{file}.safetensors")
    found = detect(checkpoint, list(tiny_families.values()))
    mapped = found.family.map(checkpoint, found.layout)
    graph = found.family.components[component].load_graph()
    compiled = sdkit.compile(Model(graph, mapped.weights[component]), backend="reference")
    goldens = _goldens(family)
    prefix = f"{family}/inputs/{component}/"
    outputs = compiled.run({k[len(prefix) :]: v for k, v in goldens.items() if k.startswith(prefix)})
    expected = {k.rpartition("/")[2]: v for k, v in goldens.items() if k.startswith(f"{file}/{component}/")}
    assert expected
    for name, value in expected.items():
        np.testing.assert_allclose(outputs[name], value, rtol=0, atol=1e-4, err_msg=f"{file}/{component}/{name}")


def _rewrite(source: Path, target: Path, rename: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of ``source`` with keys renamed or dropped (raw bytes kept, bf16 included)."""
    checkpoint = Checkpoint.open(source)
    arrays = {}
    for key in checkpoint:
        if key in drop:
            continue
        entry = checkpoint.entry(key)
        arrays[(rename or {}).get(key, key)] = (entry, checkpoint.files[0].raw(entry))
    header: dict[str, Any] = {}
    data = b""
    for key, (entry, raw) in arrays.items():
        header[key] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [len(data), len(data) + raw.nbytes],
        }
        data += raw.tobytes()
    text = json.dumps(header).encode()
    target.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return target


def test_a_renamed_key_is_one_error_naming_both_names(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    key = "model.diffusion_model.out.2.weight"
    bad = _rewrite(TINY / "sd1" / "sd1_fp16.safetensors", tmp_path / "renamed.safetensors", {key: key + "_old"})
    checkpoint = Checkpoint.open(bad)
    found = detect(checkpoint, list(tiny_families.values()))
    with pytest.raises(ModelFormatError) as caught:
        found.family.map(checkpoint, found.layout)
    message = str(caught.value)
    assert "renamed.safetensors is not a complete tiny sd1 checkpoint (LDM/SGM single file)" in message
    shaped = r"1 weight\(s\) missing or mis-shaped \(the unet's 1 of \d+\): "
    assert re.search(shaped + re.escape(f"{key} (missing)"), message)
    assert f"keys in the file that nothing reads: {key}_old" in message


def test_missing_keys_are_counted_and_listed(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    source = TINY / "sd1" / "sd1_fp16.safetensors"
    vae = tuple(k for k in Checkpoint.open(source) if k.startswith("first_stage_model."))
    bad = _rewrite(source, tmp_path / "novae.safetensors", drop=vae)
    checkpoint = Checkpoint.open(bad)
    found = detect(checkpoint, list(tiny_families.values()))  # the UNet and CLIP still say SD 1.x
    counted = (
        r"124 weight\(s\) missing or mis-shaped \(the vae_encoder's (\d+) of \1, the vae_decoder's (\d+) of \2\): "
    )
    with pytest.raises(ModelFormatError, match=counted + r"first_stage_model\.\S+ "):
        found.family.map(checkpoint, found.layout)
    with pytest.raises(ModelFormatError, match=r"and 119 more"):
        found.family.map(checkpoint, found.layout)


def test_unknown_keys_are_a_warning(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    source = TINY / "sd1" / "sd1_fp16.safetensors"
    extra = tmp_path / "extra.safetensors"
    checkpoint = Checkpoint.open(source)
    arrays = {k: np.asarray(checkpoint.files[0].raw(checkpoint.entry(k))) for k in checkpoint}
    arrays["model.diffusion_model.something_new.weight"] = np.ones(3, np.float16)
    save_file(arrays, str(extra))
    extended = Checkpoint.open(extra)
    found = detect(extended, list(tiny_families.values()))
    with pytest.warns(UnusedKeysWarning, match=r"1 tensor\(s\) that no tiny sd1 component reads: model\.diffusion"):
        mapped = found.family.map(extended, found.layout)
    assert mapped.unknown == ("model.diffusion_model.something_new.weight",)


def test_a_file_of_no_family_says_what_it_looks_like(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    lora = tmp_path / "style.safetensors"
    save_file({"lora_unet_down_blocks_0_proj_in.lora_down.weight": np.ones((4, 8), np.float16)}, str(lora))
    with pytest.raises(ModelFormatError, match=r"style.safetensors is not a checkpoint of a known model family: LoRA"):
        detect(Checkpoint.open(lora), list(tiny_families.values()))


def test_key_map_is_the_seam_for_lora_and_vae_files(tiny_families: dict[str, Family]) -> None:
    """``Family.key_map(component, layout)``: graph initializer -> where each layout stores it."""
    family = tiny_families["sdxl"]
    unet = family.key_map("unet", "ldm")
    assert unet["down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight"].key == (
        "model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight"
    )
    assert unet["up_blocks.0.upsamplers.0.conv.weight"].key == "model.diffusion_model.output_blocks.2.2.conv.weight"
    clip_g = family.key_map("text_encoder_2", "ldm")
    q = clip_g["text_model.encoder.layers.3.self_attn.q_proj.weight"]
    assert (q.key, q.rows) == ("conditioner.embedders.1.model.transformer.resblocks.3.attn.in_proj_weight", (0, 48))
    assert clip_g["text_projection.weight"].transpose
    vae = family.key_map("vae_decoder", "diffusers")
    assert vae["decoder.mid_block.attentions.0.to_q.weight"].keys == (
        "vae.decoder.mid_block.attentions.0.to_q.weight",
        "vae.decoder.mid_block.attentions.0.query.weight",
    )


def test_a_diffusers_folder_is_one_checkpoint(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    folder = diffusers_folder(tmp_path)
    checkpoint = Checkpoint.open(folder)
    found = detect(checkpoint, list(tiny_families.values()))
    assert (found.family.name, found.layout) == ("tiny_sd1", "diffusers")
    mapped = found.family.map(checkpoint, found.layout)
    expected = _expected("sd1", "unet")
    for name in ("conv_in.weight", "up_blocks.0.attentions.2.proj_out.weight"):
        np.testing.assert_array_equal(mapped.weights["unet"][name], expected[name].astype(np.float32))


def diffusers_folder(root: Path, family: str = "sd1") -> Path:
    """The tiny family's diffusers config folder with its ``<family>_diffusers_fp16`` file split
    into ``<component>/diffusion_pytorch_model.safetensors`` / ``model.safetensors``."""
    folder = root / f"{family}-diffusers"
    shutil.copytree(TINY / family / "config", folder)
    checkpoint = Checkpoint.open(TINY / family / f"{family}_diffusers_fp16.safetensors")
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key in checkpoint:
        component, _, name = key.partition(".")
        parts.setdefault(component, {})[name] = np.asarray(checkpoint.files[0].raw(checkpoint.entry(key)))
    for component, arrays in parts.items():
        file = "model.safetensors" if component.startswith("text_encoder") else "diffusion_pytorch_model.safetensors"
        save_file(arrays, str(folder / component / file))
    return folder


def test_old_clip_keys_without_text_model(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    """SD 1.x files saved with transformers < 4.20 name CLIP ``cond_stage_model.transformer.encoder.*``."""
    source = TINY / "sd1" / "sd1_fp16.safetensors"
    old = "cond_stage_model.transformer.text_model."
    renames = {k: k.replace(old, "cond_stage_model.transformer.") for k in Checkpoint.open(source) if k.startswith(old)}
    checkpoint = Checkpoint.open(_rewrite(source, tmp_path / "old_clip.safetensors", renames))
    found = detect(checkpoint, list(tiny_families.values()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = found.family.map(checkpoint, found.layout)
    expected = _expected("sd1", "text_encoder")
    for name in ("text_model.embeddings.token_embedding.weight", "text_model.encoder.layers.4.mlp.fc2.bias"):
        np.testing.assert_array_equal(mapped.weights["text_encoder"][name], expected[name].astype(np.float32))
