"""``backend="auto"`` between sdkit's own pipeline and a pipeline engine that also reads the file
(stable-diffusion.cpp), decided by whole-image timings ``sdkit tune`` stored
(``sdkit.pipelines.loaders.engine_timings`` / ``engine_tuning``).

The engine here is a test double registered as a pipeline loader with ``engine = "fakecpp"``: it
returns black images after a set delay, so which engine is faster is set by the test (sdkit's own
pipeline is the real tiny SD 1.x pipeline on onnx.reference, about 0.5 s per image at 32 px and
one step on 2 loaded cores; the double takes 0 or 2 s). sdkit-sdcpp's own tests run the same
choice with the real binding (``-m slow``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import sdkit
from sdkit.backend import Availability
from sdkit.errors import OptionError
from sdkit.families import Family
from sdkit.pipelines import Pipeline, PipelineConfig, PipelineLoader
from sdkit.pipelines.loaders.engine_timings import measured_engine
from sdkit.pipelines.loaders.engine_tuning import WholeImage, tune_engines
from sdkit.pipelines.stages.components import LoadSettings
from sdkit.plugins import get_plugins
from sdkit.tuning import TuneSettings

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
FILE = TINY / "sd1" / "sd1_fp32.safetensors"
ENGINES = ("fakecpp",)  # not stable-diffusion.cpp where it is installed: it cannot load the tiny file
SETTINGS = TuneSettings(repeat=1, warmup=0)  # onnx.reference compiles nothing: no warm-up


class FakeEnginePipeline(Pipeline):
    delay_s: ClassVar[float] = 0.0

    def run(self, request: Any) -> Any:
        time.sleep(self.delay_s)
        return np.zeros((1, request.height or 32, request.width or 32, 3), np.float32)

    def backends(self) -> dict[str, str | None]:
        return {"pipeline": "fakecpp (cpu)"}


class FakeEngineLoader(PipelineLoader):
    name: ClassVar[str] = "fakecpp"
    engine: ClassVar[str] = "fakecpp"
    priority: ClassVar[int] = 30
    version: ClassVar[str] = "1.0"

    def sniff(self, path: Path) -> bool:
        return False  # it reads no file on its own: only what it accepts when asked

    def accepts(self, path: Path) -> bool:
        return path.suffix == ".safetensors"

    def probe(self) -> Availability:
        return Availability(True, "test double", version=self.version)

    def devices(self) -> list[Any]:
        return []

    def build(self, path: Path, settings: LoadSettings) -> Pipeline:
        return FakeEnginePipeline(PipelineConfig(name=path.stem, sample_size=4), {})


@pytest.fixture
def engine(tiny_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch) -> type[FakeEnginePipeline]:
    get_plugins().loaders.add(FakeEngineLoader)
    monkeypatch.setenv("SDKIT_BACKEND", "reference")  # onnx.reference: no compile (CI time)
    monkeypatch.setattr(FakeEnginePipeline, "delay_s", 0.0)
    return FakeEnginePipeline


def test_auto_never_picks_an_engine_unmeasured(engine: type[FakeEnginePipeline]) -> None:
    pipe = sdkit.load_pipeline(FILE, prepare=False)
    assert not isinstance(pipe, FakeEnginePipeline)
    assert pipe.engine_choice == ""
    assert isinstance(sdkit.load_pipeline(FILE, backend="fakecpp"), FakeEnginePipeline)  # asked for: taken


def test_tune_measures_both_and_auto_loads_the_faster(engine: type[FakeEnginePipeline]) -> None:
    result = tune_engines(FILE, WholeImage(32, 32, steps=1), settings=SETTINGS, engines=ENGINES)
    medians = {m.backend: m.median_s for m in result.record.results}
    assert set(medians) == {"sdkit", "fakecpp"} and result.path is not None and result.path.is_file()
    assert medians["fakecpp"] < medians["sdkit"]
    assert result.choice is not None and result.choice.engine == "fakecpp"
    pipe = sdkit.load_pipeline(FILE, prepare=False)
    assert isinstance(pipe, FakeEnginePipeline)
    assert pipe.engine_choice.startswith("measured fastest per whole image (32x32, 1 steps: fakecpp")
    # another device, other options or the engine upgraded: the record no longer applies
    assert not isinstance(sdkit.load_pipeline(FILE, prepare=False, threads=1), FakeEnginePipeline)
    FakeEngineLoader.version = "2.0"
    try:
        assert measured_engine(FILE, None, {}) is None
    finally:
        FakeEngineLoader.version = "1.0"


def test_sdkit_measured_faster_stays_and_sizes_that_disagree_keep_sdkit(engine: type[FakeEnginePipeline]) -> None:
    engine.delay_s = 2.0
    tune_engines(FILE, WholeImage(32, 32, steps=1), settings=SETTINGS, engines=ENGINES)
    pipe = sdkit.load_pipeline(FILE, prepare=False)
    assert not isinstance(pipe, FakeEnginePipeline)
    assert pipe.engine_choice.startswith("measured fastest per whole image (32x32, 1 steps: sdkit")
    engine.delay_s = 0.0
    result = tune_engines(FILE, WholeImage(48, 48, steps=1), settings=SETTINGS, engines=ENGINES)
    assert result.choice is not None and result.choice.engine == "sdkit"
    assert "disagree by size" in result.choice.reason
    assert not isinstance(sdkit.load_pipeline(FILE, prepare=False), FakeEnginePipeline)


def test_a_file_no_engine_reads_is_refused(tiny_families: dict[str, Family]) -> None:
    with pytest.raises(OptionError, match="no pipeline engine"):
        tune_engines(FILE, WholeImage(32, 32), settings=SETTINGS, engines=ENGINES)
