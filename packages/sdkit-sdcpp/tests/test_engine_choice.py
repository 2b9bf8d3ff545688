"""``backend="auto"`` on a single file both engines read: sdkit's own pipeline unless ``sdkit tune``
measured stable-diffusion.cpp faster per whole image on this file, here
(``sdkit.pipelines.loaders.engine_timings``). sd.cpp runs the whole pipeline in its own code, so
the comparison is per whole image, not per component.

Without the binding (CI): the choice reads only stored records, and never picks sd.cpp
unmeasured. With it (``-m slow``): ``sdkit tune`` times both on the full-size SD 1.5 file and
``load_pipeline`` then loads the one measured faster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from sdcpp_helpers import needs_binding

import sdkit
from sdkit.cli.main import main
from sdkit.errors import BackendUnavailableError
from sdkit.pipelines.loaders.engine_timings import engine_key, fastest
from sdkit.pipelines.loaders.loading import measured_choice
from sdkit.timings import Measurement, TimingsRecord
from sdkit.tuning import timings_store
from sdkit_sdcpp import binding
from sdkit_sdcpp.loader import SdcppLoader
from sdkit_sdcpp.pipeline import SdcppPipeline


def _record(file: Path, sdkit_s: float, sdcpp_s: float) -> TimingsRecord:
    results = (
        Measurement("sdkit", median_s=sdkit_s, min_s=sdkit_s, compile_s=1.0, runs=1),
        Measurement("sdcpp", median_s=sdcpp_s, min_s=sdcpp_s, compile_s=1.0, runs=1),
    )
    return TimingsRecord(engine_key(file, None, {}, 64, 64, 2), results, "sdkit", 1e-3, "now", "test", 1, 0)


def test_auto_picks_sdcpp_only_where_a_tune_measured_it_faster(
    sdkit_isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    info = binding.BuildInfo("0.4.7", "test", ("CPU",), "AVX2 = 1")
    monkeypatch.setattr(binding, "build_info", lambda: info)  # an installed binding, as probe sees it
    file = tmp_path / "model.safetensors"
    save_file({"x": np.zeros(4, np.float16)}, str(file))
    assert measured_choice(file, None, {}) == (None, None)  # unmeasured: sdkit's own pipeline
    timings_store().store(_record(file, sdkit_s=2.0, sdcpp_s=3.0))
    loader, choice = measured_choice(file, None, {})
    assert loader is None and choice is not None and choice.engine == "sdkit"
    timings_store().store(_record(file, sdkit_s=2.0, sdcpp_s=1.0))
    loader, choice = measured_choice(file, None, {})
    assert isinstance(loader, SdcppLoader) and choice is not None
    assert choice.reason.startswith("measured fastest per whole image (64x64, 2 steps: sdcpp 1 s")

    def missing() -> Any:
        raise BackendUnavailableError("sdcpp", "stable-diffusion-cpp-python is not installed")

    monkeypatch.setattr(binding, "build_info", missing)  # the binding gone: the record no longer applies
    assert measured_choice(file, None, {}) == (None, None)


@needs_binding
@pytest.mark.slow
def test_tune_times_both_and_auto_loads_the_faster(
    sdkit_isolated: Path, sd15: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("sdkit_openvino")
    argv = ["tune", str(sd15), "--backends", "openvino", "--width", "64", "--height", "64", "--steps", "2"]
    assert main([*argv, "--repeat", "1", "--warmup", "1", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{sd15.name}: whole image, 64x64, 2 steps" in out
    [record] = [r for _, r in timings_store().entries() if r is not None and r.key["graph"].startswith("pipeline")]
    assert {m.backend for m in record.results if m.ok} == {"sdkit", "sdcpp"}
    winner = fastest(record)
    assert winner is not None
    print(out)  # the table, for the report (pytest -s)
    with sdkit.load_pipeline(sd15, threads=2, prepare=False) as pipe:
        assert isinstance(pipe, SdcppPipeline) == (winner[0] == "sdcpp")
        assert pipe.engine_choice.startswith(f"measured fastest per whole image (64x64, 2 steps: {winner[0]}")


def test_tune_refuses_a_file_only_sdcpp_reads(sdkit_isolated: Path, tmp_path: Path, capsys: Any) -> None:
    from sdkit.testing.gguf_files import write_gguf

    file = write_gguf(
        tmp_path / "model.gguf", {"model.diffusion_model.input_blocks.0.0.weight": ((320, 4, 3, 3), "f16")}
    )
    assert main(["tune", str(file)]) != 0
    assert "model.gguf runs only on a pipeline engine" in capsys.readouterr().err
