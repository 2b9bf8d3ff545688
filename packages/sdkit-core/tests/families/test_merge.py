"""Checkpoint merging (``sdkit.families.merge``, ``sdkit merge``) against a numpy oracle written
here key by key from A1111's rules (``modules/extras.py``: which keys merge, the formulas, the
inpainting channels, the VAE bake), the files read back by the ``safetensors`` library; the
tiny SD 1.x checkpoint merged loads and generates as any other file, and a LoRA baked in gives
diffusers' fused-LoRA UNet output (``fixtures/families/tiny/sd1/adapters.npz``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import sdkit
from sdkit.cli.main import main
from sdkit.errors import InputError, ModelFormatError
from sdkit.families.merge import merge_checkpoints, to_bf16_bits

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"


def bf16(values: np.ndarray) -> np.ndarray:
    """float32 values exactly representable in bfloat16, and their bits (the file's storage)."""
    bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_bf16(path: Path, tensors: dict[str, np.ndarray], bf16_keys: dict[str, np.ndarray]) -> None:
    """A safetensors file with ``bf16_keys`` stored as BF16 (patched into the header)."""
    save_file({**tensors, **{k: bf16(v) for k, v in bf16_keys.items()}}, str(path))
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    for key in bf16_keys:
        header[key]["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (length - len(text))
    assert len(text) == length
    path.write_bytes(data[:8] + text + data[8 + length :])


def files(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def r(*shape: int, dtype: Any = np.float16) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    a = {
        "model.diffusion_model.input_blocks.0.0.weight": r(4, 9, 3, 3),  # inpainting A
        "model.diffusion_model.out.weight": r(8, 4),
        "first_stage_model.decoder.conv_in.weight": r(3, 4, dtype=np.float32),
        "cond_stage_model.transformer.text_model.embeddings.position_ids": np.arange(6, dtype=np.int64)[None],
        "alphas_cumprod": r(5, dtype=np.float32),  # no "model": copied from A
        "model.only_a": r(3),
    }
    b = {
        "model.diffusion_model.input_blocks.0.0.weight": r(4, 4, 3, 3),
        "model.diffusion_model.out.weight": r(8, 4),
        "first_stage_model.decoder.conv_in.weight": r(3, 4),
        "cond_stage_model.transformer.text_model.embeddings.position_ids": np.arange(6, dtype=np.int64)[None] + 1,
        "alphas_cumprod": r(5, dtype=np.float32),
        "model.only_b": r(2, 2),
    }
    c = {k: r(*v.shape, dtype=v.dtype) for k, v in b.items() if k != "model.diffusion_model.out.weight"}
    c["cond_stage_model.transformer.text_model.embeddings.position_ids"] = b[
        "cond_stage_model.transformer.text_model.embeddings.position_ids"
    ]
    shared = r(8, 2, dtype=np.float32).astype(np.float32)
    a_bf16 = {"conditioner.embedders.0.model.proj": from_bf16(bf16(shared))}
    b_bf16 = {"conditioner.embedders.0.model.proj": from_bf16(bf16(shared[::-1].copy()))}
    paths = {name: tmp_path / f"{name}.safetensors" for name in ("a", "b", "c")}
    write_bf16(paths["a"], a, a_bf16)
    write_bf16(paths["b"], b, b_bf16)
    save_file(c, str(paths["c"]))
    return {"paths": paths, "a": {**a, **a_bf16}, "b": {**b, **b_bf16}, "c": c}


def oracle(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], c: dict[str, np.ndarray] | None, alpha: float
) -> dict[str, np.ndarray]:
    """A1111's run_modelmerger, key by key, in float32 (the merged values before the dtype)."""
    skip = "cond_stage_model.transformer.text_model.embeddings.position_ids"
    m = np.float32(alpha)
    theta1 = {k: v.astype(np.float32) for k, v in b.items() if v.dtype.kind == "f"}
    if c is not None:
        for key, value in list(theta1.items()):
            if "model" in key:
                theta1[key] = value - (c[key].astype(np.float32) if key in c else 0)
    out: dict[str, np.ndarray] = {}
    for key, value in a.items():
        if "model" in key and key in theta1 and key != skip:
            x, y = value.astype(np.float32), theta1[key]
            head = x[:, :4] if x.shape != y.shape else x
            merged = head * (1 - m) + y * m if c is None else head + y * m
            if head is not x:
                x[:, :4], merged = merged, x
            out[key] = merged
        else:
            out[key] = value
    for key, value in theta1.items():
        if "model" in key and key not in a:
            out[key] = value
    return out


def read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The output read by the safetensors library (numpy has no bf16: those from the bytes)."""
    data = path.read_bytes()
    base = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:base])
    assert header.pop("__metadata__")["format"] == "pt"
    dtypes = {key: spec["dtype"] for key, spec in header.items()}
    tensors = {}
    with safe_open(str(path), framework="numpy") as f:  # type: ignore[no-untyped-call]
        for key in (k for k, d in dtypes.items() if d != "BF16"):
            tensors[key] = f.get_tensor(key)
    for key in (k for k, d in dtypes.items() if d == "BF16"):
        begin, end = header[key]["data_offsets"]
        bits = np.frombuffer(data[base + begin : base + end], dtype="<u2").reshape(header[key]["shape"])
        tensors[key] = from_bf16(bits)
    return tensors, dtypes


@pytest.mark.parametrize("mode", ["weighted-sum", "add-difference"])
@pytest.mark.parametrize("dtype", [None, "fp16", "fp32"])
def test_merge_equals_the_key_by_key_oracle(mode: str, dtype: str | None, tmp_path: Path) -> None:
    made = files(tmp_path)
    p = made["paths"]
    out = tmp_path / "out.safetensors"
    c = p["c"] if mode == "add-difference" else None
    report = merge_checkpoints(p["a"], p["b"], c, output=out, mode=mode, alpha=0.3, dtype=dtype)
    got, dtypes = read(out)
    want = oracle(made["a"], made["b"], made["c"] if c else None, 0.3)
    assert set(got) == set(want)
    skip = "cond_stage_model.transformer.text_model.embeddings.position_ids"
    made_by_merge = {k for k in want if k not in made["a"] or ("model" in k and k in made["b"] and k != skip)}
    for key, value in want.items():
        # fp32: every float; fp16: what the merge made (A1111's save-as-half); else A's dtype
        stored = "F32" if dtype == "fp32" else "F16" if dtype == "fp16" and key in made_by_merge else None
        source = made["a"].get(key, made["b"].get(key))
        if value.dtype.kind != "f":
            np.testing.assert_array_equal(got[key], value)  # A's, never merged (position_ids)
            continue
        natural = (
            "BF16" if key.startswith("conditioner.") else {np.float16: "F16", np.float32: "F32"}[source.dtype.type]
        )
        assert dtypes[key] == (stored or natural), key
        expected = value.astype(np.float32)
        if dtypes[key] == "F16":
            expected = expected.astype(np.float16).astype(np.float32)
        elif dtypes[key] == "BF16":
            expected = from_bf16(to_bf16_bits(expected))
        np.testing.assert_array_equal(got[key].astype(np.float32), expected, err_msg=key)
    assert report.counts["merge"] == 4 and report.counts["from-b"] == 1


def test_bf16_rounding_is_nearest_even() -> None:
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 1 + 2**-9], np.float32)
    assert to_bf16_bits(values).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x3F80]


def test_vae_bake_and_keep(tmp_path: Path) -> None:
    made = files(tmp_path)
    p = made["paths"]
    vae = {"decoder.conv_in.weight": np.full((3, 4), 7.0, np.float32), "loss.logvar": np.zeros(1, np.float32)}
    save_file(vae, str(tmp_path / "vae.safetensors"))
    key = "first_stage_model.decoder.conv_in.weight"
    merge_checkpoints(p["a"], p["b"], output=tmp_path / "baked.safetensors", vae=tmp_path / "vae.safetensors")
    baked, _ = read(tmp_path / "baked.safetensors")
    np.testing.assert_array_equal(baked[key], vae["decoder.conv_in.weight"])
    assert not any("loss" in k for k in baked)
    merge_checkpoints(p["a"], p["b"], output=tmp_path / "kept.safetensors", keep_vae=True)
    np.testing.assert_array_equal(read(tmp_path / "kept.safetensors")[0][key], made["a"][key])
    save_file({"encoder.down_blocks.0.x": np.zeros(2, np.float32)}, str(tmp_path / "diffusers_vae.safetensors"))
    with pytest.raises(ModelFormatError, match="LDM-layout VAE"):
        merge_checkpoints(p["a"], output=tmp_path / "x.safetensors", vae=tmp_path / "diffusers_vae.safetensors")


def test_refusals(tmp_path: Path) -> None:
    made = files(tmp_path)
    p = made["paths"]
    out = tmp_path / "out.safetensors"
    (tmp_path / "old.ckpt").write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelFormatError, match="pickled checkpoints are refused"):
        merge_checkpoints(tmp_path / "old.ckpt", p["b"], output=out)
    with pytest.raises(InputError, match="three checkpoints"):
        merge_checkpoints(p["a"], p["b"], output=out, mode="add-difference")
    with pytest.raises(InputError, match="two checkpoints"):
        merge_checkpoints(p["a"], p["b"], p["c"], output=out)
    with pytest.raises(InputError, match="one of the inputs"):
        merge_checkpoints(p["a"], p["b"], output=p["a"])
    with pytest.raises(ModelFormatError, match="inpainting or instruct-pix2pix model must be A"):
        merge_checkpoints(p["b"], p["a"], output=out)  # plain A, inpainting B
    save_file({"unet.conv_in.weight": np.zeros((2, 2), np.float16)}, str(tmp_path / "diffusers.safetensors"))
    with pytest.raises(ModelFormatError, match="share none"):  # never a silent copy of A
        merge_checkpoints(tmp_path / "diffusers.safetensors", tmp_path / "diffusers.safetensors", output=out)
    with pytest.raises(InputError, match="nothing to merge"):
        merge_checkpoints(p["a"], output=out)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_multiplier_is_refused(alpha: float, tmp_path: Path) -> None:
    """Issue 30's second pass: ``--alpha nan`` wrote a checkpoint of NaN weights, exit 0."""
    p = files(tmp_path)["paths"]
    with pytest.raises(InputError, match="must be a finite number"):
        merge_checkpoints(p["a"], p["b"], output=tmp_path / "out.safetensors", alpha=alpha)
    assert not (tmp_path / "out.safetensors").exists()


def test_an_unwritable_output_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30's second pass: an output in a missing folder was a FileNotFoundError traceback
    (``sdkit: internal error`` from the CLI)."""
    p = files(tmp_path)["paths"]
    out = tmp_path / "no" / "such" / "out.safetensors"
    with pytest.raises(InputError, match=r"cannot write .*out.safetensors: No such file or directory"):
        merge_checkpoints(p["a"], p["b"], output=out)
    assert main(["merge", str(p["a"]), str(p["b"]), "-o", str(out)]) == 1
    assert capsys.readouterr().err.strip().startswith("sdkit: error: cannot write")


@pytest.fixture
def sd1(tiny_families: dict[str, Any]) -> Path:
    path = TINY / "sd1" / "sd1_fp16.safetensors"
    if not path.is_file():
        pytest.skip("tiny sd1 fixtures missing")
    return path


def _generate(path: Path) -> np.ndarray:
    pipe = sdkit.load_pipeline(path, backend="reference")
    try:
        [image] = pipe.generate("a cat", seed=3, steps=2, width=32, height=32, output_type="np")
    finally:
        pipe.close()
    return np.asarray(image)


def test_merged_file_loads_and_alpha_ends_are_the_inputs(sd1: Path, tmp_path: Path) -> None:
    """``sdkit merge`` of the tiny SD 1.x fp16 and fp32 files: alpha 0 is A and alpha 1 is B
    bit for bit (as fp32: A's fp16 values widen exactly), and the merged file loads and
    generates as any checkpoint."""
    fp32 = TINY / "sd1" / "sd1_fp32.safetensors"
    out0, out1 = tmp_path / "m0.safetensors", tmp_path / "m1.safetensors"
    assert main(["merge", str(sd1), str(fp32), "--alpha", "0", "--dtype", "fp32", "-o", str(out0)]) == 0
    assert main(["merge", str(sd1), str(fp32), "--alpha", "1", "-o", str(out1)]) == 0
    assert main(["merge", str(sd1), str(fp32), "-o", str(out1)]) == 1  # exists
    a, b = load_file(str(sd1)), load_file(str(fp32))
    m0, m1 = load_file(str(out0)), load_file(str(out1))
    assert set(m0) == set(a)
    for key in a:
        np.testing.assert_array_equal(m0[key], a[key].astype(m0[key].dtype))
        if key in b:  # A's dtype (fp16) by default
            np.testing.assert_array_equal(m1[key], b[key].astype(a[key].dtype))
    image = _generate(out0)  # loads as any checkpoint: detected, mapped, compiled, run
    assert image.shape == (32, 32, 3) and np.isfinite(image).all()


@pytest.mark.parametrize(
    ("family", "case"),
    [("sd1", "sd1_kohya_locon@0.5"), ("sdxl", "sdxl_kohya_locon@0.5"), ("sdxl", "sdxl_kohya_locon@1.0+sdxl_peft@0.5")],
)
def test_lora_baked_in_gives_diffusers_fused_outputs(
    family: str, case: str, sd1: Path, tmp_path: Path, tiny_families: dict[str, Any]
) -> None:
    """``sdkit merge A --lora FILE:S ... --dtype fp32`` on the tiny SD 1.x / SDXL files (LDM/SGM
    layout: SDXL's OpenCLIP q/k/v fused in ``in_proj_weight``, the LoRA's change placed back into
    its rows): the baked file, mapped as any checkpoint, gives diffusers' outputs with the same
    LoRAs fused (``adapters.npz``: UNet and both text encoders) within 1e-4 on the reference backend."""
    from sdkit.families.detection import load_checkpoint
    from sdkit.model import Model

    out = tmp_path / "baked.safetensors"
    argv = ["merge", str(TINY / family / f"{family}_fp16.safetensors"), "--dtype", "fp32", "-o", str(out)]
    for part in case.split("+"):
        stem, strength = part.split("@")
        argv += ["--lora", f"{TINY / family / 'lora' / stem}.safetensors:{strength}"]
    assert main(argv) == 0
    mapped = load_checkpoint(out, list(tiny_families.values()))
    assert mapped.family.name == tiny_families[family].name
    with np.load(TINY / family / "adapters.npz", allow_pickle=False) as goldens:
        expected = {k.removeprefix(f"lora/{case}/"): goldens[k] for k in goldens.files if k.startswith(f"lora/{case}/")}
        inputs = {k.removeprefix(f"{family}/inputs/"): goldens[k] for k in goldens.files if "/inputs/" in k}
    components = sorted({k.split("/")[0] for k in expected})
    assert "unet" in components
    for component in components:
        graph = tiny_families[family].components[component].load_graph()
        compiled = sdkit.compile(Model(graph, mapped.weights[component]), backend="reference")
        feeds = {k.split("/")[1]: v for k, v in inputs.items() if k.startswith(f"{component}/")}
        got = compiled.run(feeds)
        for key, want in expected.items():
            if key.startswith(f"{component}/"):
                np.testing.assert_allclose(got[key.split("/")[1]], want, rtol=0, atol=1e-4, err_msg=key)
    mapped.checkpoint.close()
