"""LoRA files merged by ``sdkit.families.lora`` against diffusers (and LyCORIS files against peft).

Oracle: diffusers' ``load_lora_weights`` + ``set_adapters(strengths)`` + ``fuse_lora`` on the same
fp16 checkpoint, its UNet and text encoders run on the family's golden inputs
(``fixtures/families/tiny/<family>/adapters.npz``, ``lora/<case>/...``). Here the merged weights
run on the reference backend (onnx.reference). Required: max |diff| <= 1e-4 for every case
(kohya LoCon and attention files, PEFT in both ``text_model`` spellings, two files at once).
LyCORIS LoHa and LoKr files (which diffusers does not load): peft's ``LoHaConfig``/``LoKrConfig``
layers merged into the same UNet (``tiny/sd1/lycoris.npz``, ``make_lycoris.py``), same tolerance.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.families import Family, MappedCheckpoint, load_checkpoint
from sdkit.families.lora import UnusedLoraKeysWarning, lora_targets, merge_loras
from sdkit.families.lora_file import open_lora
from sdkit.model import Model

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
TOLERANCE = 1e-4


def _cases(family: str) -> list[str]:
    path = TINY / family / "adapters.json"
    return sorted(json.loads(path.read_text(encoding="utf-8"))["lora_cases"]) if path.is_file() else []


def _mapped(family: str, tiny: dict[str, Family]) -> MappedCheckpoint:
    return load_checkpoint(TINY / family / f"{family}_fp16.safetensors", list(tiny.values()))


def _lora(family: str, stem: str) -> Path:
    return TINY / family / "lora" / f"{stem}.safetensors"


def _run(mapped: MappedCheckpoint, component: str, changes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    graph = mapped.family.components[component].load_graph()
    compiled = sdkit.compile(Model(graph, mapped.weights[component].updated(changes)), backend="reference")
    family = mapped.family.name.removeprefix("tiny_")
    with np.load(TINY / family / "adapters.npz", allow_pickle=False) as goldens:
        prefix = f"{family}/inputs/{component}/"
        feeds = {k[len(prefix) :]: goldens[k] for k in goldens.files if k.startswith(prefix)}
    return compiled.run(feeds)


@pytest.mark.parametrize(
    ("family", "case"),
    [(f, c) for f in ("sd1", "sdxl") for c in _cases(f)] or [pytest.param("", "", marks=pytest.mark.skip)],
)
def test_merged_loras_equal_diffusers_fuse_lora(tiny_families: dict[str, Family], family: str, case: str) -> None:
    mapped = _mapped(family, tiny_families)
    loras = [(open_lora(_lora(family, p.split("@")[0])), float(p.split("@")[1])) for p in case.split("+")]
    merged = merge_loras(mapped.family, mapped.weights, loras)
    with np.load(TINY / family / "adapters.npz", allow_pickle=False) as goldens:
        expected = {k.removeprefix(f"lora/{case}/"): goldens[k] for k in goldens.files if k.startswith(f"lora/{case}/")}
    with np.load(TINY / family / "goldens.npz", allow_pickle=False) as base:
        assert np.abs(expected["unet/out_sample"] - base[f"{family}_fp16/unet/out_sample"]).max() > 1e-2
    checked = 0
    for component in ("unet", "text_encoder", "text_encoder_2"):
        if component not in mapped.weights:
            continue
        outputs = _run(mapped, component, merged.get(component, {}))
        for key, value in expected.items():
            part, _, output = key.partition("/")
            if part == component:
                assert np.abs(outputs[output] - value).max() <= TOLERANCE, (component, output)
                checked += 1
    assert checked >= 4


def test_the_base_weights_are_never_changed(tiny_families: dict[str, Family]) -> None:
    mapped = _mapped("sd1", tiny_families)
    before = {n: mapped.weights["unet"][n] for n in mapped.weights["unet"]}
    merged = merge_loras(mapped.family, mapped.weights, [(open_lora(_lora("sd1", "sd1_kohya_locon")), 1.0)])
    assert len(merged["unet"]) > 10 and len(merged["text_encoder"]) == 30
    assert all(np.array_equal(mapped.weights["unet"][n], before[n]) for n in before)
    assert all(merged["unet"][n].dtype == np.float32 for n in merged["unet"])


def test_kohya_names_of_each_family_match_the_fixture_map(tiny_families: dict[str, Family]) -> None:
    """Every module of the kohya files names the graph weight make_adapters.py verified."""
    for family in ("sd1", "sdxl"):
        targets = lora_targets(_mapped(family, tiny_families).family)
        meta = json.loads((TINY / family / "adapters.json").read_text(encoding="utf-8"))["loras"]
        for stem in (f"{family}_kohya_locon", f"{family}_kohya_attn"):
            for module, target in meta[stem]["graph_names"].items():
                assert f"{targets[module].component}:{targets[module].name}" == target


def _rewrite(source: Path, target: Path, change: Any) -> Path:
    with open(source, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    header = change(header)
    text = json.dumps(header).encode()
    target.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return target


def test_bad_lora_files_give_one_clear_error(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    sd1, sdxl = _mapped("sd1", tiny_families), _mapped("sdxl", tiny_families)
    with pytest.raises(
        ModelFormatError, match=r"does not fit this model: module lora_unet_\w+ is \[16, 32\], the unet weight"
    ):
        merge_loras(sdxl.family, sdxl.weights, [(open_lora(_lora("sd1", "sd1_kohya_locon")), 1.0)])

    def renamed(header: dict[str, Any]) -> dict[str, Any]:
        return {k.replace(".lora_down.", ".down.").replace(".lora_up.", ".up."): v for k, v in header.items()}

    bad = _rewrite(_lora("sd1", "sd1_kohya_attn"), tmp_path / "renamed.safetensors", renamed)
    with pytest.raises(ModelFormatError, match=r"renamed.safetensors is not a LoRA: no <module>.lora_down"):
        open_lora(bad)

    def other_modules(header: dict[str, Any]) -> dict[str, Any]:
        return {k.replace("transformer_blocks", "blocks").replace("self_attn", "attn"): v for k, v in header.items()}

    bad = _rewrite(_lora("sd1", "sd1_kohya_attn"), tmp_path / "other.safetensors", other_modules)
    with pytest.raises(
        ModelFormatError,
        match=r"other.safetensors is not a LoRA for tiny sd1: none of its \d+ modules names a layer of it \(lora_",
    ):
        merge_loras(sd1.family, sd1.weights, [(open_lora(bad), 1.0)])
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(_lora("sd1", "sd1_kohya_attn").read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match=r"truncated.safetensors is truncated"):
        open_lora(truncated)
    pickled = shutil.copy(_lora("sd1", "sd1_kohya_attn"), tmp_path / "lora.pt")
    with pytest.raises(ModelFormatError, match=r"pickled checkpoints are refused"):
        open_lora(pickled)
    tucker = tmp_path / "tucker.safetensors"
    save_file(
        {"lora_unet_x.hada_t1": np.ones((4, 4, 3, 3), np.float16), "lora_unet_x.alpha": np.ones((), np.float16)},
        str(tucker),
    )
    with pytest.raises(
        ModelFormatError, match=r"is a LyCORIS file of a kind sdkit does not merge \(LoHa with Tucker\)"
    ):
        open_lora(tucker)


def test_modules_that_match_nothing_are_named(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    sd1 = _mapped("sd1", tiny_families)

    def one_renamed(header: dict[str, Any]) -> dict[str, Any]:
        return {k.replace("layers_0_self_attn_q_proj", "layers_0_self_attn_qq_proj"): v for k, v in header.items()}

    path = _rewrite(_lora("sd1", "sd1_kohya_attn"), tmp_path / "partly.safetensors", one_renamed)
    with pytest.warns(UnusedLoraKeysWarning, match=r"1 key\(s\) match no layer of tiny sd1 .*qq_proj"):
        merged = merge_loras(sd1.family, sd1.weights, [(open_lora(path), 1.0)])
    assert len(merged["text_encoder"]) == 19


def test_peft_scale_comes_from_the_metadata(tmp_path: Path) -> None:
    lora = open_lora(_lora("sd1", "sd1_peft"))
    module = next(iter(lora.modules.values()))
    assert lora.format == "peft" and lora.ranks() == [4] and lora.scale(module) == 2.0
    arrays = {k: lora.tensor(k) for k in lora.checkpoint}
    save_file(arrays, str(tmp_path / "bare.safetensors"))  # no lora_adapter_metadata: alpha = r
    bare = open_lora(tmp_path / "bare.safetensors")
    assert bare.scale(bare.modules[module.name]) == 1.0


def test_older_diffusers_spellings_are_read(tmp_path: Path) -> None:
    arrays = {
        "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.down.weight": np.ones((2, 16)),
        "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.up.weight": np.ones((16, 2)),
        "unet.down_blocks.1.attentions.0.proj_in.lora.down.weight": np.ones((2, 16, 1, 1)),
        "unet.down_blocks.1.attentions.0.proj_in.lora.up.weight": np.ones((16, 2, 1, 1)),
        "unet.down_blocks.1.attentions.0.proj_in.alpha": np.array(1.0),
    }
    save_file({k: v.astype(np.float32) for k, v in arrays.items()}, str(tmp_path / "old.safetensors"))
    lora = open_lora(tmp_path / "old.safetensors")
    assert lora.format == "diffusers"
    assert set(lora.modules) == {
        "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
        "unet.down_blocks.1.attentions.0.proj_in",
    }
    assert lora.scale(lora.modules["unet.down_blocks.1.attentions.0.proj_in"]) == 0.5


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_loha_and_lokr_equal_peft(tiny_families: dict[str, Family], kind: str) -> None:
    mapped = _mapped("sd1", tiny_families)
    lora = open_lora(_lora("sd1", f"sd1_{kind}"))
    assert lora.kinds() == [kind] and len(lora.modules) == 84
    merged = merge_loras(mapped.family, mapped.weights, [(lora, 1.0)])
    with np.load(TINY / "sd1" / "lycoris.npz", allow_pickle=False) as goldens:
        expected = goldens[f"sd1_{kind}/unet/out_sample"]
    with np.load(TINY / "sd1" / "goldens.npz", allow_pickle=False) as base:
        assert np.abs(expected - base["sd1_fp16/unet/out_sample"]).max() > 1e-2
    assert np.abs(_run(mapped, "unet", merged["unet"])["out_sample"] - expected).max() <= TOLERANCE


def test_a_header_length_starting_with_0x80_is_no_pickle(tmp_path: Path) -> None:
    """128 + 256k header bytes: the file's first byte is a pickle's (0x80); still safetensors."""
    from sdkit.families import Checkpoint

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (0x180 - len(header))
    path = tmp_path / "padded.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.ones(2, np.float32).tobytes())
    assert path.read_bytes()[0] == 0x80 and Checkpoint.open(path).keys() == ["w"]
    (tmp_path / "pickle.safetensors").write_bytes(b"\x80\x04\x95" + bytes(20))
    with pytest.raises(ModelFormatError, match=r"this is a PyTorch pickle"):
        Checkpoint.open(tmp_path / "pickle.safetensors")
