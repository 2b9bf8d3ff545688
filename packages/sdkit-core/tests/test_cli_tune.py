"""``sdkit tune`` and the timings in ``sdkit doctor``: the table, the store, what auto picks
afterwards, pipelines tuned per component, and one-line errors. Run times come from the fake
backends' injected costs (``timed_plugins``), never from the wall clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import sdkit
from sdkit import tuning
from sdkit.cli import tune as tune_cli
from sdkit.cli.main import main
from sdkit.testing import one_node_model

TINY = Path(__file__).resolve().parents[3] / "fixtures" / "tiny_pipeline" / "model"


@pytest.fixture
def relu_file(tmp_path: Path) -> Path:
    model = one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})
    path = tmp_path / "relu.onnx"
    onnx.save(model.graph.proto, path)  # no weights: the graph is the whole model
    return path


@pytest.fixture
def fake_time(timed_plugins: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The command's tune runs on the fake clock."""
    real = tune_cli.settings_from
    monkeypatch.setattr(
        tune_cli, "settings_from", lambda args: dataclasses.replace(real(args), clock=timed_plugins.clock)
    )
    return timed_plugins


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _table(out: str) -> dict[str, list[str]]:
    """The rows of the table by backend (the columns before the verdict split on spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("backend "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line or line[0] == " " or len(line.split()) < 3 or line.split()[1] != "cpu":
            break
        rows[line.split()[0]] = line.split()
    return rows


def test_tune_prints_the_table_stores_and_auto_follows(
    fake_time: Any, relu_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "tune", str(relu_file), "--backends", "reference,slowhigh,wrong,fastlow", "--repeat", "3"
    )
    assert code == 0, err
    header = out.splitlines()[1].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "backend", "device", "compile s", "median s", "min s", "x fastest", "rel-L2 vs reference", "verdict",
    ]  # fmt: skip
    rows = _table(out)
    assert rows["fastlow"][3:6] == ["1.0000", "1.0000", "1.00"] and "chosen: measured fastest" in out
    assert rows["slowhigh"][3:6] == ["3.0000", "3.0000", "3.00"] and rows["slowhigh"][-1] == "slower"
    assert rows["wrong"][5] == "-" and "outputs differ from reference's: rel-L2 2.00e+00 > 0.001" in out
    assert "fallback: 1 run, never chosen for speed" in out
    assert "3 timed run(s) after 1 warm-up per backend; baseline reference" in out
    assert 'backend="auto" now picks fastlow on cpu' in out and "stored: " in out
    assert sdkit.choose_backend(relu_file).backend == "fastlow"
    code, out, _ = _run(capsys, "doctor")
    assert code == 0
    assert "timings: " in out and "(1 record(s)" in out and "relu.onnx" in out and "x=2x3" in out
    assert "; current" in out
    assert "fastlow" in out and "1 s median of 3 on cpu, 1.00x the fastest" in out
    assert "slowhigh" in out and "3.00x the fastest" in out


def test_doctor_flags_stale_and_corrupt_records(
    fake_time: Any, relu_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(capsys, "tune", str(relu_file), "--backends", "slowhigh,fastlow")[0] == 0
    (tuning.timings_store().folder / "0123.json").write_text("{ truncated")
    monkeypatch.setattr(tuning, "accelerators", lambda: ["ggml cuda:0 NVIDIA H100"])
    code, out, _ = _run(capsys, "doctor")
    assert code == 0
    assert "0123.json: unreadable or malformed, ignored" in out
    assert "stale, ignored: other GPUs/accelerators" in out
    assert "automatic choice: wrong on cpu (priority 95)" in out


def test_tune_takes_inputs_and_options(fake_time: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onnx import helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    code, _, err = _run(capsys, "tune", str(path), "--backends", "fastlow")
    assert code == 1 and err.startswith("sdkit: error: ") and "no fixed shape" in err and len(err.splitlines()) == 1
    code, out, err = _run(
        capsys, "tune", str(path), "--random", "x=5x3", "--threads", "2", "--backends", "slowhigh,fastlow"
    )
    assert code == 0, err
    assert "(x=5x3)" in out
    record = tuning.timings_store().entries()[0][1]
    assert record is not None and record.key["options"]["threads"] == 2 and record.key["input_shapes"] == {"x": [5, 3]}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--tolerance", "-1"], "--tolerance must be a number >= 0"),
        (["--backends", "fastlw"], "did you mean 'fastlow'"),
        (["--precision", "fp16", "--backends", "fastlow", "--nonesuch"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    fake_time: Any, relu_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code, _, err = _run(capsys, "tune", str(relu_file), *argv)
    except SystemExit as exc:  # argparse's own usage errors
        code, err = int(str(exc.code)), capsys.readouterr().err
        assert code == 2 and message in err
        return
    assert code == 1 and err.startswith("sdkit: error: ") and message in err and len(err.splitlines()) == 1


def test_a_pipeline_is_tuned_per_component(fake_time: Any, capsys: pytest.CaptureFixture[str]) -> None:
    if not (TINY / "model_index.json").is_file():
        pytest.skip("the tiny pipeline fixture is missing")
    argv = ("tune", str(TINY), "--backends", "slowhigh,fastlow", "--repeat", "1", "--warmup", "0")
    code, out, err = _run(capsys, *argv, "--width", "32", "--height", "32")
    assert code == 0, err
    for component in ("text_encoder", "unet", "vae_decoder"):
        assert f"\n{component}:\n" in f"\n{out}"
    assert "vae_encoder: not run by a txt2img, not tuned" in out
    assert "unet/model.onnx (encoder_hidden_states=2x77x32, sample=2x4x16x16, timestep=1)" in out
    assert out.count('backend="auto" now picks fastlow on cpu') == 3
    # a later generation with auto (no tune) takes the stored choice for each component
    pipe = sdkit.load_pipeline(TINY)
    try:
        pipe.generate("a photo", width=32, height=32, steps=1, seed=0)
        assert pipe.backends() == {
            "text_encoder": "fastlow", "unet": "fastlow", "vae_decoder": "fastlow", "vae_encoder": None,
        }  # fmt: skip
    finally:
        pipe.close()
