"""``sdkit generate``: PNG with A1111-style parameters, read back with PIL; one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sdkit.cli.main import main
from sdkit.pipelines.imaging.images import GenerationParameters
from sdkit.testing.cli_output import without_progress


def test_generate_writes_png_with_parameters(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "folder" / "cat.png"  # missing folders are created
    argv = [
        "generate",
        "a red cat",
        "--model",
        str(tiny_dir),
        "-o",
        str(out),
        "--negative",
        "blurry",
        "--steps",
        "2",
        "--seed",
        "1",
        "--sampler",
        "Euler Karras",
        "--cfg",
        "7",
        "--width",
        "32",
        "--height",
        "32",
        "--backend",
        "reference",
    ]
    assert main(argv) == 0
    with Image.open(out) as image:
        assert image.size == (32, 32)
        assert image.format == "PNG"
        text = image.info["parameters"]
    lines = text.split("\n")
    assert lines[0] == "a red cat"
    assert lines[1] == "Negative prompt: blurry"
    assert lines[2].startswith(
        f"Steps: 2, Sampler: Euler, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 32x32, Model: {tiny_dir.name}"
    )
    captured = capsys.readouterr()
    assert "saved" in captured.out
    assert "\r" not in captured.err  # no bar when stderr is not a terminal: plain lines (test_cli_progress)
    assert "sampling 2/2" in captured.err


def test_img2img_from_the_command_line(
    tiny_dir: Path,
    tmp_path: Path,
    golden: dict[str, np.ndarray],
    capsys: pytest.CaptureFixture[str],
) -> None:
    init = tmp_path / "init.png"
    Image.fromarray(golden["init_image"]).save(init)
    out = tmp_path / "out.png"
    argv = [
        "generate",
        "a dog",
        "--model",
        str(tiny_dir),
        "-o",
        str(out),
        "--init-image",
        str(init),
        "--strength",
        "0.5",
        "--steps",
        "2",
        "--seed",
        "3",
        "--cfg",
        "1",
        "--backend",
        "reference",
        "--memory",
        "offload",
        "--num-images",
        "2",
    ]
    assert main(argv) == 0
    assert "sampling" in capsys.readouterr().err
    for i in range(2):
        with Image.open(tmp_path / f"out-{i}.png") as image:
            assert image.size == (32, 32)
            assert f"Seed: {3 + i}," in image.info["parameters"]
            assert "Denoising strength: 0.5" in image.info["parameters"]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--width", "100"], "width must be a multiple of 8"),
        (["--steps", "0"], "steps must be an integer >= 1"),
        (["--sampler", "nosuch"], "nosuch"),
        (["--backend", "unet=reference,oops"], "--backend expects"),
    ],
)
def test_bad_requests_are_one_line(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    argv = [
        "generate",
        "a cat",
        "--model",
        str(tiny_dir),
        "-o",
        str(tmp_path / "x.png"),
        "--backend",
        "reference",
        *extra,
    ]
    assert main(argv) == 1
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("sdkit: error: ")
    assert match in err
    assert "\n" not in err
    assert not (tmp_path / "x.png").exists()


def test_arguments_are_checked_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "a cat", "--model", str(tmp_path / "missing"), "--width", "30"]) == 1
    assert "width must be a multiple of 8" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["missing", "empty"])
def test_not_a_pipeline_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["generate", "a cat", "--model", str(tmp_path / model)]) == 1
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("sdkit: error: ")
    assert "\n" not in err


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = without_progress(capsys.readouterr().err).strip()
    assert err.startswith("sdkit: error: ") and "\n" not in err
    return err


def test_a_pickled_checkpoint_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same refusal as ``sdkit run``: a .ckpt is never opened, whatever the command."""
    checkpoint = tmp_path / "v1-5.ckpt"
    checkpoint.write_bytes(b"not even a pickle")
    err = _one_line_error(capsys, ["generate", "a cat", "--model", str(checkpoint)])
    assert "v1-5.ckpt: pickled checkpoints are refused (unpickling can run code)" in err
    assert "weights_only=True" in err  # the safe conversion command
    assert _one_line_error(capsys, ["run", str(checkpoint), "--random", "x=1"]).endswith(err.split(": ", 2)[2])


def test_a_broken_single_file_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``.safetensors`` file goes to the single-file loader, which says what is wrong with it."""
    checkpoint = tmp_path / "v1-5.safetensors"
    checkpoint.write_bytes(b"{}")
    err = _one_line_error(capsys, ["generate", "a cat", "--model", str(checkpoint)])
    assert "v1-5.safetensors is not a safetensors file (2 bytes)" in err


def test_a_corrupt_component_is_named(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    data = (copy / "unet" / "model.onnx").read_bytes()
    (copy / "unet" / "model.onnx").write_bytes(data[: len(data) // 3])
    argv = ["generate", "a cat", "--model", str(copy), "--backend", "reference", "-o", str(tmp_path / "x.png")]
    err = _one_line_error(capsys, argv)
    assert f"unet/model.onnx in {copy} is not a readable ONNX model: " in err
    assert "(the pipeline's unet); export or download it again" in err
    assert not (tmp_path / "x.png").exists()


def test_a1111_text_format() -> None:
    params = GenerationParameters("a cat", "ugly", 20, "euler_a", "karras", 7.0, 1, 64, 64, "tiny")
    assert params.a1111_text() == (
        "a cat\nNegative prompt: ugly\n"
        "Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 64x64, "
        "Model: tiny, Software: sdkit"
    )
    assert "Negative prompt" not in GenerationParameters("a", "", 1, "ddim", "normal", 7.5, 2, 8, 8, "m").a1111_text()


def test_generate_from_a_single_file_checkpoint(tiny_families: object, tmp_path: Path) -> None:
    """``sdkit generate --model file.safetensors --prediction v``: a SD 2.x-v file without its
    .yaml gives diffusers' image (the committed golden, rounded to 8 bits by the PNG)."""
    import shutil

    tiny = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny" / "sd2v"
    model = Path(shutil.copy(tiny / "sd2v_fp16.safetensors", tmp_path / "my_sd2.safetensors"))
    out = tmp_path / "castle.png"
    argv = ["generate", "a photo of an astronaut riding a horse on the moon", "--model", str(model), "-o", str(out)]
    argv += ["--negative", "blurry, low quality", "--steps", "3", "--seed", "11", "--sampler", "euler", "--cfg", "7.5"]
    argv += ["--width", "32", "--height", "32", "--backend", "reference", "--prediction", "v"]
    assert main(argv) == 0
    with np.load(tiny / "goldens.npz") as goldens:
        expected = goldens["sd2v_fp16/txt2img/image"][0]
    with Image.open(out) as image:
        pixels = np.asarray(image, dtype=np.float32) / 255
        assert "Model: my_sd2" in image.info["parameters"]
    assert np.abs(pixels - expected).max() <= 0.5 / 255 + 1e-3


def test_stable_diffusion_cpp_flags_are_aliases(tiny_dir: Path, tmp_path: Path) -> None:
    """stable-diffusion.cpp's names give the same image and parameters as sdkit's own."""
    common = ["generate", "--model", str(tiny_dir), "--backend", "reference", "--steps", "2"]
    ours = tmp_path / "ours.png"
    theirs = tmp_path / "theirs.png"
    own = ["a red cat", "-o", str(ours), "--negative", "blurry", "--seed", "3", "--sampler", "euler", "--cfg", "6"]
    own += ["--schedule", "karras", "--width", "32", "--height", "24"]
    sd_cpp = ["-p", "a red cat", "--output", str(theirs), "-n", "blurry", "-s", "3", "--sampling-method", "euler"]
    sd_cpp += ["--cfg-scale", "6", "--scheduler", "karras", "-W", "32", "-H", "24"]
    assert main(common + own) == 0
    assert main(common + sd_cpp) == 0
    with Image.open(ours) as a, Image.open(theirs) as b:
        assert a.info["parameters"] == b.info["parameters"]
        assert "CFG scale: 6, Seed: 3, Size: 32x24" in a.info["parameters"]
        assert np.array_equal(np.asarray(a), np.asarray(b))
    img2img = tmp_path / "img2img.png"
    argv = [*common, "-p", "a dog", "-i", str(ours), "--strength", "0.5", "-s", "4", "-o", str(img2img)]
    assert main(argv) == 0
    with Image.open(img2img) as image:
        assert image.size == (32, 24)
        assert "Denoising strength: 0.5" in image.info["parameters"]


def test_default_cfg_is_seven(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.png"
    argv = ["generate", "a cat", "--model", str(tiny_dir), "--backend", "reference", "--steps", "1", "-o", str(out)]
    assert main([*argv, "--seed", "1", "--width", "32", "--height", "32"]) == 0
    with Image.open(out) as image:
        assert "CFG scale: 7, " in image.info["parameters"]


def test_numbered_outputs_never_overwrite(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "a cat", "--model", str(tiny_dir), "--backend", "reference", "--steps", "1"]
    argv += ["--width", "32", "--height", "32", "--seed", "5"]
    assert main(argv) == 0
    assert main([*argv, "--num-images", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "outputs" / "txt2img").iterdir()) == [
        "00000-5.png",
        "00001-5.png",
        "00002-6.png",
    ]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "00041-9.png").write_bytes(b"not touched")
    assert main([*argv, "--outdir", "mine"]) == 0
    assert (tmp_path / "mine" / "00041-9.png").read_bytes() == b"not touched"
    assert (tmp_path / "mine" / "00042-5.png").is_file()
    init = tmp_path / "outputs" / "txt2img" / "00000-5.png"
    assert main([*argv, "--init-image", str(init), "--strength", "1"]) == 0
    assert [p.name for p in (tmp_path / "outputs" / "img2img").iterdir()] == ["00000-5.png"]


def test_output_refuses_to_overwrite_without_force(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cat.png"
    out.write_bytes(b"precious")
    argv = ["generate", "a cat", "--model", str(tiny_dir), "--backend", "reference", "--steps", "1", "-o", str(out)]
    argv += ["--width", "32", "--height", "32"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("sdkit: error: ") and "--force" in err and "\n" not in err
    assert out.read_bytes() == b"precious"
    assert main([*argv, "--force"]) == 0
    with Image.open(out) as image:
        assert image.size == (32, 32)


def test_sampler_names_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--list-samplers"]) == 0
    listing = capsys.readouterr().out
    assert "dpmpp_2m: DPM++ 2M" in listing and "karras" in listing and "euler_flow" in listing
    for label in ("DPM2", "DPM2 a", "DPM++ 2S a", "DPM++ 3M SDE", "LMS", "DDPM", "Heun++ 2", "Euler CFG++"):
        assert f": {label}," in listing  # k_solvers' A1111 labels, each with its ComfyUI name
    assert "dpm_2_a_flow" in listing
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = capsys.readouterr().out
    assert "dpmpp_2m: DPM++ 2M" in help_text and "sgm_uniform" in help_text and "--sampling-method" in help_text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sampler", "eulr"], "unknown sampler 'eulr' (did you mean 'euler'?)"),
        (["--schedule", "krras"], "unknown schedule 'krras' (did you mean 'karras'?)"),
        (["-p", "a dog"], "not both"),
        (["-o", "a.png", "--outdir", "x"], "not both"),
    ],
)
def test_flag_errors_name_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["generate", "a cat", "--model", str(tmp_path / "missing"), *extra]) == 1
    assert message in capsys.readouterr().err
