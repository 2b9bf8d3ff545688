"""``sdkit generate --lora/--lora-dir/--embedding/--vae`` and ``sdkit inspect`` of adapter files.

The numbers are checked against diffusers in ``tests/families/test_lora.py``,
``test_embeddings_and_vae.py`` and ``tests/pipelines/test_adapters.py``; here the command line
must give the image the API gives with the same adapters, keep A1111's ``<lora:...>`` tags in the
PNG's prompt, and turn bad input into one ``sdkit: error:`` line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import sdkit
from sdkit.cli.lora_embeddings_vae_options import lora_argument
from sdkit.cli.main import main
from sdkit.testing.cli_output import without_progress

SD1 = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd1"
PROMPT = "a photo of skstyle riding a horse <lora:sd1_kohya_attn:0.6>"
# --cfg 7.5: the API's default guidance_scale, which the expected images are made with
SETTINGS = ["--steps", "2", "--seed", "5", "--sampler", "euler", "--width", "32", "--height", "32", "--cfg", "7.5"]


def _argv(out: Path) -> list[str]:
    argv = ["generate", PROMPT, "--model", str(SD1 / "sd1_fp16.safetensors"), "-o", str(out), *SETTINGS]
    argv += ["--backend", "reference", "--lora-dir", str(SD1 / "lora")]
    argv += [
        "--lora",
        f"{SD1 / 'lora' / 'sd1_peft.safetensors'}:0.5",
        "--embedding",
        str(SD1 / "embeddings" / "skstyle.safetensors"),
    ]
    return [*argv, "--vae", str(SD1 / "vae" / "vae_diffusers_fp16.safetensors")]


def test_generate_with_loras_embedding_and_vae(tiny_families: object, tmp_path: Path) -> None:
    out = tmp_path / "styled.png"
    assert main(_argv(out)) == 0
    pipe = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend="reference")
    pipe.load_embedding(SD1 / "embeddings" / "skstyle.safetensors")
    pipe.set_vae(SD1 / "vae" / "vae_diffusers_fp16.safetensors")
    pipe.set_loras([(SD1 / "lora" / "sd1_peft.safetensors", 0.5), (SD1 / "lora" / "sd1_kohya_attn.safetensors", 0.6)])
    expected = pipe.generate(PROMPT, steps=2, seed=5, sampler="euler", width=32, height=32)[0]
    plain = sdkit.load_pipeline(SD1 / "sd1_fp16.safetensors", backend="reference")
    without = plain.generate(PROMPT, steps=2, seed=5, sampler="euler", width=32, height=32)[0]
    with Image.open(out) as image:
        assert image.info["parameters"].startswith(PROMPT + "\n")
        assert np.array_equal(np.asarray(image), np.asarray(expected))
        assert not np.array_equal(np.asarray(image), np.asarray(without))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--lora-dir", "KEEP"], "the prompt has <lora:...> tags: say where their files are with --lora-dir"),
        (["--lora", "missing.safetensors:0.5"], "--lora: no such file: missing.safetensors"),
        (["--vae", str(SD1 / "lora" / "sd1_peft.safetensors")], "sd1_peft.safetensors is not a VAE for tiny sd1"),
        (
            ["--embedding", str(SD1 / "lora" / "sd1_peft.safetensors")],
            "sd1_peft.safetensors is not a textual-inversion",
        ),
    ],
)
def test_bad_adapter_flags_are_one_line(
    tiny_families: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: list[str], message: str
) -> None:
    argv = _argv(tmp_path / "x.png")
    flag, value = change
    index = argv.index(flag)
    if value == "KEEP":
        del argv[index : index + 2]
    else:
        argv[index + 1] = value
    assert main(argv) == 1
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("sdkit: error: ") and message in err and "\n" not in err


def test_lora_argument() -> None:
    assert lora_argument("a/b.safetensors:0.7") == (Path("a/b.safetensors"), 0.7)
    assert lora_argument("a/b.safetensors") == (Path("a/b.safetensors"), 1.0)
    assert lora_argument("C:\\loras\\b.safetensors") == (Path("C:\\loras\\b.safetensors"), 1.0)


def test_inspect_lora_and_embedding(tiny_families: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(SD1 / "lora" / "sd1_kohya_locon.safetensors")]) == 0
    text = capsys.readouterr().out
    assert "LoRA (147 modules)" in text and "kohya (sd-scripts), LoCon (3x3 convs)" in text
    assert "rank          2, 4" in text and "base model    sd_v1" in text
    assert (
        main(["inspect", str(shutil.copy(SD1 / "embeddings" / "skstyle.safetensors", tmp_path / "ink.safetensors"))])
        == 0
    )
    text = capsys.readouterr().out
    assert "emb_params  3 vector(s) of width 32" in text and "L2 norms" in text and "token       ink" in text
