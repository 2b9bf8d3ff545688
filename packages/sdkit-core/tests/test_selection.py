"""Backend choice: explicit > SDKIT_BACKEND / config > probe ok and check clean > priority;
the error lists every candidate and why it was rejected."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import sdkit
from sdkit import plugins as plugins_module
from sdkit.backend import Availability, SupportReport
from sdkit.errors import (
    BackendUnavailableError,
    DeviceError,
    NoBackendError,
    OptionError,
    UnknownBackendError,
    UnsupportedNode,
)
from sdkit.model import Graph
from sdkit.plugins import Plugins
from sdkit.reference import ReferenceBackend
from sdkit.selection import choose
from sdkit.testing import one_node_model


class FastBackend(ReferenceBackend):
    """Runs like the reference backend, claims a high priority."""

    name: ClassVar[str] = "fast"
    priority: ClassVar[int] = 90


class BrokenBackend(ReferenceBackend):
    name: ClassVar[str] = "broken"
    priority: ClassVar[int] = 100

    def probe(self) -> Availability:
        return Availability(False, "runtime missing", "pip install broken-runtime")


class PickyBackend(ReferenceBackend):
    name: ClassVar[str] = "picky"
    priority: ClassVar[int] = 95

    def check(self, graph: Graph) -> SupportReport:
        report = SupportReport(self.name)
        for node in graph.nodes:
            if node.op_type == "Relu":
                report.unsupported.append(UnsupportedNode(node.name, "Relu", "", 17, "no Relu here"))
        return report


class GpuOnlyBackend(ReferenceBackend):
    name: ClassVar[str] = "gpuonly"
    priority: ClassVar[int] = 99

    def devices(self) -> list[sdkit.Device]:
        return [sdkit.Device("cuda", 0)]


class Q8Backend(ReferenceBackend):
    """Declares q8_0 (and runs as the reference backend would: the choice is what is tested)."""

    name: ClassVar[str] = "q8"
    priority: ClassVar[int] = 10
    precisions: ClassVar[tuple[str, ...] | None] = ("fp32", "q8_0")


class UndeclaredBackend(ReferenceBackend):
    """A plugin written before backends declared precisions."""

    name: ClassVar[str] = "undeclared"
    priority: ClassVar[int] = 5
    precisions: ClassVar[tuple[str, ...] | None] = None


@pytest.fixture
def fake_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _install(monkeypatch, [FastBackend, BrokenBackend, PickyBackend, GpuOnlyBackend])


def _install(monkeypatch: pytest.MonkeyPatch, classes: list[type[ReferenceBackend]]) -> Iterator[None]:
    module = types.ModuleType("fake_selection_plugin")
    exec(
        textwrap.dedent(
            """
            from sdkit.plugins import hookimpl
            @hookimpl
            def sdkit_register_backends(registry):
                for cls in CLASSES:
                    registry.add(cls)
            """
        ),
        module.__dict__,
    )
    module.CLASSES = classes  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    ep = importlib.metadata.EntryPoint("fake", module.__name__, "sdkit")
    loaded = Plugins([ep])
    monkeypatch.setattr(plugins_module.manager, "_plugins", loaded)
    yield
    sys.modules.pop(module.__name__, None)


def _relu() -> sdkit.Model:
    return one_node_model("Relu", {"x": np.zeros((2, 3), np.float32)})


def _neg() -> sdkit.Model:
    return one_node_model("Neg", {"x": np.zeros((2, 3), np.float32)})


@pytest.mark.usefixtures("fake_plugins")
def test_priority_after_probe_device_and_check() -> None:
    # broken (100): probe fails; gpuonly (99): no cpu; picky (95): fine for Neg
    assert choose(_neg().graph, device="cpu").backend.name == "picky"
    # for Relu picky's check rejects it, so fast (90) wins
    assert choose(_relu().graph, device="cpu").backend.name == "fast"


@pytest.mark.usefixtures("fake_plugins")
def test_no_device_given_takes_the_backends_first_device() -> None:
    choice = choose(_neg().graph)
    assert choice.backend.name == "gpuonly" and str(choice.device) == "cuda:0"


@pytest.mark.usefixtures("fake_plugins")
def test_environment_preference_beats_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_BACKEND", "reference")
    assert choose(_neg().graph, device="cpu").backend.name == "reference"
    monkeypatch.setenv("SDKIT_BACKEND", "nonesuch")
    with pytest.raises(UnknownBackendError, match="nonesuch"):
        choose(_neg().graph)


@pytest.mark.usefixtures("fake_plugins")
def test_config_preference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('backend_preference = ["fast", "picky"]\n')
    monkeypatch.setenv("SDKIT_CONFIG", str(config))
    assert choose(_neg().graph, device="cpu").backend.name == "fast"


@pytest.mark.usefixtures("fake_plugins")
def test_explicit_beats_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_BACKEND", "fast")
    assert choose(_neg().graph, backend="reference").backend.name == "reference"
    with pytest.raises(BackendUnavailableError, match="pip install broken-runtime"):
        choose(_neg().graph, backend="broken")
    with pytest.raises(UnknownBackendError, match="did you mean 'fast'"):
        choose(_neg().graph, backend="fsat")
    with pytest.raises(DeviceError, match="cuda:0"):
        choose(_neg().graph, backend="fast", device="cuda:0")


@pytest.mark.usefixtures("fake_plugins")
def test_error_lists_every_candidate_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NoBackendError) as info:
        choose(_relu().graph, device="vulkan:0")
    text = str(info.value)
    for name, why in (
        ("broken", "runtime missing"),
        ("gpuonly", "no device vulkan:0"),
        ("picky", "no device"),
        ("reference", "no device"),
    ):
        assert f"{name}: " in text and why in text


def test_compile_and_run_through_the_public_api() -> None:
    model = _relu()
    compiled = sdkit.compile(model)  # whatever plugins are installed: auto picks one
    assert compiled.backend_name == choose(model.graph).backend.name
    x = np.array([[-1, 0, 2], [3, -4, 5]], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["out0"], np.maximum(x, 0))


@pytest.mark.usefixtures("fake_plugins")
def test_choose_backend_says_what_auto_picks_and_why_not_the_others() -> None:
    """The public question `sdkit doctor` asks, without sdkit.selection."""
    choice = sdkit.choose_backend(_relu(), device="cpu")
    assert (choice.backend, str(choice.device)) == ("fast", "cpu")
    assert [name for name, _ in choice.rejected] == ["broken", "gpuonly", "picky"]
    assert "runtime missing" in dict(choice.rejected)["broken"]
    assert "Relu" in dict(choice.rejected)["picky"]
    anything = sdkit.choose_backend()  # no model: no check() step
    assert (anything.backend, str(anything.device)) == ("gpuonly", "cuda:0")
    assert sdkit.choose_backend(backend="reference").rejected == ()
    with pytest.raises(NoBackendError):
        sdkit.choose_backend(_relu(), device="vulkan:0")


@pytest.mark.usefixtures("fake_plugins")
def test_devices_of_every_available_backend() -> None:
    devices = sdkit.devices()
    assert "broken" not in devices
    assert [str(d) for d in devices["gpuonly"]] == ["cuda:0"]
    assert [str(d) for d in devices["reference"]] == ["cpu"]
    assert list(devices) == [b.name for b in sdkit.backends() if b.available]


def test_auto_passes_over_backends_that_do_not_offer_the_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in _install(monkeypatch, [FastBackend, PickyBackend, Q8Backend]):
        choice = sdkit.choose_backend(_neg(), device="cpu", precision="q8_0")
        assert choice.backend == "q8"  # the lowest priority, the only one offering q8_0
        why = dict(choice.rejected)
        assert why["fast"] == "does not offer precision 'q8_0' (it offers fp32, fp16, bf16)"
        assert set(why) == {"fast", "picky"}  # reference (priority 0) comes after q8
        assert sdkit.choose_backend(_neg(), device="cpu", precision="fp16").backend == "picky"  # priority again
        # an explicit backend is taken as asked: its compile gives the one clear refusal
        assert choose(_neg().graph, backend="fast", precision="q8_0").backend.name == "fast"
        with pytest.raises(OptionError, match="q8_0"):
            sdkit.compile(_neg(), backend="reference", precision="q8_0")


def test_a_plugin_that_declares_no_precisions_is_considered_for_any(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in _install(monkeypatch, [FastBackend, UndeclaredBackend]):
        assert choose(_neg().graph, device="cpu").backend.name == "fast"
        assert choose(_neg().graph, device="cpu", precision="q8_0").backend.name == "undeclared"
        info = {b.name: b.precisions for b in sdkit.backends()}
        assert info["undeclared"] is None and info["fast"] == ["fp32", "fp16", "bf16"]


def test_auto_with_a_precision_no_backend_offers_names_what_each_does(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in _install(monkeypatch, [FastBackend, PickyBackend]):
        with pytest.raises(OptionError) as info:
            sdkit.compile(_neg(), precision="q8_0")
        assert str(info.value) == (
            "no installed backend offers precision 'q8_0' (fast: fp32, fp16, bf16; "
            "picky: fp32, fp16, bf16; reference: fp32, fp16, bf16)"
        )
        # an unknown precision keeps the options' own error, naming the valid ones
        with pytest.raises(OptionError, match="precision must be one of"):
            sdkit.compile(_neg(), precision="int4")
