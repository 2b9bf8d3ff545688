"""``sdkit generate``'s progress on stderr: phase lines (load, compile with the backend's name,
first runs) and step lines in a pipe, a redrawn bar with it/s and ETA on a terminal, nothing
under ``--quiet``; the phase events of a tiled VAE pass."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdkit.cli.main import main
from sdkit.cli.progress_report import ProgressReport
from sdkit.pipelines import Component, ModelInMemory
from sdkit.pipelines.stages.phases import listening
from sdkit.pipelines.stages.tiling import tiled_decode
from sdkit.testing import one_node_model
from sdkit.testing.cli_output import without_progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def argv(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "generate",
        "a red cat",
        "--model",
        str(model),
        "-o",
        str(out),
        "--steps",
        "3",
        "--seed",
        "1",
        "--width",
        "32",
        "--height",
        "32",
        "--backend",
        "reference",
        *extra,
    ]


def positions(text: str, parts: list[str]) -> list[int]:
    found = [text.find(part) for part in parts]
    assert -1 not in found, [p for p, i in zip(parts, found, strict=True) if i == -1]
    return found


def test_plain_lines_in_a_pipe(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv(tiny_dir, tmp_path / "cat.png")) == 0
    captured = capsys.readouterr()
    order = [
        f"loading {tiny_dir} ...\n",
        "loaded StableDiffusionPipeline (text_encoder, unet, vae_decoder",
        "compiling text_encoder (backend reference) ...\n",
        "compiled text_encoder with reference in ",
        "compiled unet with reference in ",
        "compiled vae_decoder with reference in ",
        "running text_encoder for the first time ...\n",
        "first run of text_encoder: ",
        "running unet for the first time ...\n",
        "first run of unet: ",
        "sampling 1/3 ? it/s, ETA ?\n",
        "sampling 3/3 ",
        "running vae_decoder for the first time ...\n",
        "first run of vae_decoder: ",
    ]
    found = positions(captured.err, order)
    assert found == sorted(found)
    assert re.search(r"^sampling 3/3 \d+\.\d\d it/s, ETA 0:00$", captured.err, re.MULTILINE)
    assert "\r" not in captured.err and "[" not in captured.err  # lines, no bar
    assert captured.out.startswith("saved ")  # the result lines stay on stdout
    assert without_progress(captured.err) == ""  # the tests' filter knows every line written here
    assert (
        without_progress(captured.err + "Traceback (most recent call last):\n")
        == "Traceback (most recent call last):\n"
    )


def test_a_bar_with_rate_and_eta_on_a_terminal(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(argv(tiny_dir, tmp_path / "cat.png")) == 0
    text = terminal.getvalue()
    assert "\rsampling 1/3 [" in text and "\rsampling 2/3 [" in text
    assert re.search(r"\rsampling 3/3 \[#{24}\] \d+\.\d\d it/s, ETA 0:00\s*\n", text)
    found = positions(text, ["compiled unet with reference", "\rsampling 1/3", "first run of vae_decoder"])
    assert found == sorted(found)
    assert "saved " in capsys.readouterr().out


def test_quiet_prints_only_the_result(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cat.png"
    assert main([*argv(tiny_dir, out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert lines[0] == f"saved {out}" and lines[1].startswith("seed 1; ") and len(lines) == 2


def test_bar_rate_and_eta_from_a_clock() -> None:
    times = iter([10.0, 12.0, 13.0])  # step 1 ends at 10 s (after the first run), then 2 s and 1 s per step
    terminal = FakeTerminal()
    report = ProgressReport(terminal, clock=lambda: next(times))
    latents = np.zeros((1, 4, 1, 1), np.float32)
    for index in range(3):
        report.step(index, 5, latents)
    shown = terminal.getvalue().split("\r")[1:]
    assert shown[0].rstrip() == "sampling 1/5 [" + "#" * 4 + "." * 20 + "] ? it/s, ETA ?"
    assert shown[1].rstrip() == "sampling 2/5 [" + "#" * 9 + "." * 15 + "] 0.50 it/s, ETA 0:06"
    assert shown[2].rstrip() == "sampling 3/5 [" + "#" * 14 + "." * 10 + "] 0.67 it/s, ETA 0:03"


def test_plain_step_lines_at_most_one_per_interval() -> None:
    times = iter([0.0, 0.5, 1.2, 1.5, 1.6])
    stream = io.StringIO()
    report = ProgressReport(stream, interval=1.0, clock=lambda: next(times))
    for index in range(5):
        report.step(index, 5, np.zeros(1, np.float32))
    lines = stream.getvalue().splitlines()
    # the first, the one 1.2 s after it, and the last
    assert [line.split(" ")[1] for line in lines] == ["1/5", "3/5", "5/5"]


def test_tiled_vae_sends_one_event_per_tile() -> None:
    events: list[tuple[str, str, dict[str, Any]]] = []

    def listener(event: str, component: str, details: Mapping[str, Any]) -> None:
        events.append((event, component, dict(details)))

    latents = np.zeros((1, 4, 24, 16), np.float32)
    with listening(listener):
        tiled_decode(latents, lambda tile: tile, tile=16, overlap=8)
    tiled_decode(latents, lambda tile: tile, tile=16, overlap=8)  # outside the block: no events
    assert events == [("tile", "vae", {"index": i, "total": 2}) for i in (1, 2)]


@pytest.mark.parametrize(("policy", "compiles"), [("keep", 1), ("offload", 3)])
def test_component_events_compile_per_compile_and_first_run_once(policy: str, compiles: int) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    model = one_node_model("MatMul", {"x": x}, initializers={"w": w})
    component = Component("matmul", ModelInMemory(model, "matmul"), backend="reference", policy=policy)  # type: ignore[arg-type]
    events: list[tuple[str, str, dict[str, Any]]] = []
    with listening(lambda event, name, details: events.append((event, name, dict(details)))):
        outputs = [component.run({"x": x})["out0"] for _ in range(3)]
    for out in outputs:  # the first run goes through unchanged (numpy's product as the oracle)
        np.testing.assert_allclose(out, x @ w, rtol=1e-6)
    names = [event for event, _, _ in events]
    assert names.count("compile") == names.count("compiled") == compiles
    assert names.count("first run") == names.count("first ran") == 1
    assert names[:4] == ["compile", "compiled", "first run", "first ran"]
    compiled = next(details for event, _, details in events if event == "compiled")
    assert compiled["backend"] == "reference" and compiled["seconds"] >= 0
    assert all(name == "matmul" for _, name, _ in events)
