"""The ``sdkit`` command line: real model files, one-line errors and exit code 1 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdkit.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_backends_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "backends", "--json")
    data = json.loads(out)
    assert code == 0
    reference = next(b for b in data["backends"] if b["name"] == "reference")
    assert reference["available"] and reference["devices"] == ["cpu"]
    for backend in data["backends"]:
        assert isinstance(backend["available"], bool) and backend["reason"]


def test_backends_table_devices_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "backends")[1].splitlines()[0].split()[:3] == ["backend", "plugin", "available"]
    assert "reference" in _run(capsys, "devices")[1]
    code, out, _ = _run(capsys, "doctor")
    assert code == 0 and "automatic choice:" in out and "cache:" in out


def test_run_writes_outputs_that_match_onnxruntime(
    capsys: pytest.CaptureFixture[str], taef2: Path, tmp_path: Path
) -> None:
    ort = pytest.importorskip("onnxruntime")
    latent = np.load(taef2 / "dog_latent_torch.npy")[:, :, :4, :4].copy()
    np.save(tmp_path / "latent.npy", latent)
    out_file = tmp_path / "out.npz"
    code, out, err = _run(
        capsys,
        "run",
        str(taef2 / "taef2_decoder.onnx"),
        "--input",
        f"latent={tmp_path / 'latent.npy'}",
        "-o",
        str(out_file),
        "--backend",
        "reference",
    )
    assert code == 0, err
    assert "image: float32[1, 3, 32, 32]" in out
    expected = ort.InferenceSession(str(taef2 / "taef2_decoder.onnx")).run(None, {"latent": latent})[0]
    assert np.max(np.abs(np.load(out_file)["image"] - expected)) <= 1e-4


def test_bench_prints_one_table(capsys: pytest.CaptureFixture[str], taef2: Path) -> None:
    code, out, err = _run(
        capsys,
        "bench",
        str(taef2 / "taef2_decoder.onnx"),
        "--random",
        "latent=1x32x4x4",
        "--backends",
        "reference",
        "--repeat",
        "2",
    )
    assert code == 0, err
    header, row = out.strip().splitlines()
    assert header.split()[:6] == ["backend", "device", "compile", "s", "median", "s"]
    assert row.split()[0] == "reference" and row.split()[5] == "1.00" and row.split()[6] == "0.00e+00"


def test_check(capsys: pytest.CaptureFixture[str], taef2: Path) -> None:
    code, out, _ = _run(capsys, "check", str(taef2 / "taef2_encoder.onnx"), "--backend", "reference")
    assert code == 0 and out.strip() == "reference: supported"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--random", "latent=1x31x4x4"], "does not fit"),
        (["--random", "lat=1x32x4x4"], "unknown input 'lat'"),
        (["--random", "latent=1x32x4"], "rank"),
        (["--random", "latent=1x32x4x4", "--backend", "nonesuch"], "unknown backend 'nonesuch'"),
        (["--random", "latent=axb"], "cannot parse shape"),
        (["--input", "latent=/nonexistent.npy"], "not found"),
        ([], "give the model's inputs"),
        (["--random", "latent=1x32x4x4", "--threads", "0"], "threads"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], taef2: Path, args: list[str], message: str
) -> None:
    code, _, err = _run(capsys, "run", str(taef2 / "taef2_decoder.onnx"), *args)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith("sdkit: error: ") and message in err


def test_wrong_dtype_and_pickled_npy(capsys: pytest.CaptureFixture[str], taef2: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "f64.npy", np.zeros((1, 32, 4, 4)))
    code, _, err = _run(capsys, "run", str(taef2 / "taef2_decoder.onnx"), "-i", f"latent={tmp_path / 'f64.npy'}")
    assert code == 1 and "dtype float64" in err
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, _, err = _run(capsys, "run", str(taef2 / "taef2_decoder.onnx"), "-i", f"latent={tmp_path / 'obj.npy'}")
    assert code == 1 and "not a readable .npy" in err


def test_truncated_model_from_a_real_process(taef2: Path, tmp_path: Path) -> None:
    data = (taef2 / "taef2_decoder.onnx").read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 3])
    proc = subprocess.run(
        [sys.executable, "-m", "sdkit.cli.main", "run", str(tmp_path / "trunc.onnx"), "--random", "latent=1x32x4x4"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "trunc.onnx" in proc.stderr


def test_pipeline_folder_given_to_run_is_refused_quickly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text("{}")
    code, _, err = _run(capsys, "run", str(tmp_path), "--random", "x=1")
    assert code == 1 and "is a folder" in err


def test_bench_reports_nan_outputs_as_infinitely_wrong() -> None:
    from sdkit.measure import max_abs_diff  # what sdkit bench (and sdkit tune) compare with

    ones = {"y": np.ones(3, np.float32)}
    assert max_abs_diff({"y": np.array([1, np.nan, 1], np.float32)}, ones) == float("inf")
    assert max_abs_diff({"y": np.array([1, 1, 1.5], np.float32)}, ones) == 0.5


def test_inspect_says_what_a_file_is(capsys: pytest.CaptureFixture[str], tiny_families: object, tmp_path: Path) -> None:
    """``sdkit inspect``: a checkpoint's family, dtypes, parameters per component and EMA; a
    LoRA's format and rank; an embedding's vectors; a VAE; anything else's top-level keys."""
    from safetensors.numpy import save_file

    tiny = Path(__file__).resolve().parents[3] / "fixtures" / "families" / "tiny"
    code, out, _ = _run(capsys, "inspect", str(tiny / "sd1" / "sd1_ema_fp16.safetensors"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "sd1_ema_fp16.safetensors: tiny sd1 checkpoint"
    details = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert details["layout"] == "LDM/SGM single file"
    assert details["unet"] == "96,788 parameters (fp16 x304)"
    assert details["EMA"].startswith("yes (306 tensors")
    assert details["prediction"] == "epsilon (family default)"
    code, out, _ = _run(capsys, "inspect", "--json", str(tiny / "sd2v" / "sd2v_bf16.safetensors"))
    data = json.loads(out)
    assert data["kind"] == "checkpoint" and data["details"]["prediction"] == "v_prediction (from sd2v_bf16.yaml)"
    assert data["details"]["dtype"] == "bf16 x725"

    half = np.ones((4, 8), np.float16)
    files = {
        "lora": {"lora_unet_a_b.lora_down.weight": half, "lora_unet_a_b.lora_up.weight": half.T.copy()},
        "style": {"emb_params": np.ones((3, 768), np.float16)},
        "vae": {"decoder.conv_in.weight": np.ones((8, 4, 3, 3), np.float16), "encoder.down.0.block.0.x": half},
        "other": {"foo.bar.weight": half},
    }
    titles = {}
    for name, arrays in files.items():
        save_file(arrays, str(tmp_path / f"{name}.safetensors"))
        code, out, _ = _run(capsys, "inspect", "--json", str(tmp_path / f"{name}.safetensors"))
        titles[name] = (json.loads(out)["kind"], json.loads(out)["details"])
    assert titles["lora"][0] == "lora" and titles["lora"][1]["format"] == "kohya (sd-scripts)"
    assert titles["lora"][1]["rank"] == "4"
    assert titles["style"] == (
        "embedding",
        {"emb_params": "3 vector(s) of width 768 (SD 1.x (CLIP-L)); L2 norms 27.7, 27.7, 27.7", "token": "style"},
    )
    assert titles["vae"][0] == "vae" and titles["vae"][1]["latent channels"] == "4"
    assert titles["other"][0] == "unknown" and titles["other"][1]["top-level keys"] == "foo.bar x1"
    code, _, err = _run(capsys, "inspect", str(tmp_path / "missing.safetensors"))
    assert code == 1 and err.startswith("sdkit: error: checkpoint not found")


def test_plugin_subcommands_from_the_sdkit_cli_group(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another distribution adds ``sdkit hello`` through the ``sdkit.cli`` entry-point group; one
    that fails to import is listed and says why in one line when run; built-in names win."""
    import importlib.metadata

    import sdkit.cli.main as cli_main

    (tmp_path / "hello_command.py").write_text(
        "HELP = 'say hello'\n"
        "def add_arguments(parser):\n    parser.add_argument('--name', default='world')\n"
        "def run(args):\n    print(f'hello {args.name}')\n    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = [
        importlib.metadata.EntryPoint("hello", "hello_command", cli_main.PLUGIN_GROUP),
        importlib.metadata.EntryPoint("broken", "no_such_module_for_sdkit", cli_main.PLUGIN_GROUP),
        importlib.metadata.EntryPoint("run", "no_such_module_either", cli_main.PLUGIN_GROUP),
    ]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: entries if group == cli_main.PLUGIN_GROUP else []
    )
    assert _run(capsys, "hello", "--name", "sdkit")[:2] == (0, "hello sdkit\n")
    code, _, err = _run(capsys, "broken", "--anything")
    assert (
        code == 1
        and err.startswith("sdkit: error: the 'broken' command of a plugin failed to load")
        and err.count("\n") == 1
    )
    assert "input" in build_parser_help(capsys)  # the built-in `run` is still core's
    # sdkit-serve's command, its distribution not installed: one line naming the extra and its command
    from sdkit.known_backends import install_command

    code, _, err = _run(capsys, "serve", "--port", "8000")
    assert (code, err) == (1, f"sdkit: error: 'sdkit serve' needs the serve extra: {install_command('serve')}\n")


def build_parser_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    return capsys.readouterr().out
