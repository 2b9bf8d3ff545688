"""The measured choice (``sdkit.tuning``): a tune stores timings and ``auto`` picks the measured
fastest; stale, foreign and corrupt timings are never used. Run times come from the fake
backends' injected costs (``timed_plugins`` in conftest), never from the wall clock."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import sdkit
from sdkit import tuning
from sdkit.errors import InputError, UnknownBackendError
from sdkit.model import Model
from sdkit.testing import one_node_model
from sdkit.tuned import ShapeDeferred
from sdkit.tuning import TuneSettings, default_backends, stored_measured, tune

X = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)


def _relu() -> Model:
    return one_node_model("Relu", {"x": X})


def _symbolic_relu() -> Model:
    """Relu over ``x[batch, 3]``: its shapes are only known when it runs (a pipeline's case)."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


class OtherCpu:
    def describe(self) -> str:
        return "Other CPU (x86_64): avx"


def _settings(timed: Any, **kwargs: Any) -> TuneSettings:
    return TuneSettings(clock=timed.clock, repeat=3, warmup=1, **kwargs)


def test_untuned_auto_keeps_the_priority_order(timed_plugins: Any) -> None:
    assert sdkit.choose_backend(_relu()).backend == "wrong"  # priority 95: nothing measured
    assert "priority 95" in sdkit.choose_backend(_relu()).reason
    assert not isinstance(sdkit.compile(_symbolic_relu()), ShapeDeferred)  # no timings: compiled as ever


def test_the_measured_fastest_agreeing_backend_is_chosen(timed_plugins: Any) -> None:
    result = tune(_relu(), settings=_settings(timed_plugins, backends=("reference", "slowhigh", "wrong", "fastlow")))
    record = result.record
    assert record.first == "reference" and result.path is not None and result.path.is_file()
    medians = {m.backend: m.median_s for m in record.results}
    assert medians["slowhigh"] == pytest.approx(3.0) and medians["fastlow"] == pytest.approx(1.0)
    assert record.result("reference").runs == 1  # a fallback: one run, the exact baseline
    wrong = record.result("wrong")
    assert not wrong.agrees and wrong.rel_l2 == pytest.approx(2.0) and not wrong.ok  # negated outputs
    assert record.result("fastlow").rel_l2 == 0.0 and record.result("fastlow").ok
    assert result.choice is not None and result.choice.backend.name == "fastlow"
    # from now on auto picks it, and says why the others lost
    choice = sdkit.choose_backend(_relu())
    assert choice.backend == "fastlow" and choice.reason.startswith("measured fastest: 1 s median")
    why = dict(choice.rejected)
    assert "outputs differ from reference's" in why["wrong"]
    assert why["slowhigh"] == "measured slower: 3 s median, 3.00x fastlow's"
    assert "a fallback" in why["reference"]
    compiled = sdkit.compile(_relu())
    assert compiled.backend_name == "fastlow"
    np.testing.assert_array_equal(compiled.run({"x": X})["out0"], np.maximum(X, 0))


def test_a_wrong_baseline_is_overruled_by_the_reference(timed_plugins: Any) -> None:
    """By default the baseline is the backend auto would take untuned (``wrong``, priority 95);
    when the others disagree with it, the exact reference backend arbitrates."""
    assert default_backends(None) == ["wrong", "slowhigh", "fastlow"]
    result = tune(_relu(), settings=_settings(timed_plugins))
    assert result.record.first == "reference"
    assert [m.backend for m in result.record.results] == ["reference", "wrong", "slowhigh", "fastlow"]
    assert not result.record.result("wrong").agrees
    assert result.choice is not None and result.choice.backend.name == "fastlow"


def test_no_arbiter_when_everything_agrees(timed_plugins: Any) -> None:
    result = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert [m.backend for m in result.record.results] == ["slowhigh", "fastlow"]
    assert result.record.first == "slowhigh" and result.choice is not None
    assert result.choice.backend.name == "fastlow"


@pytest.mark.parametrize(
    "change",
    [
        "shapes",
        "threads",
        "precision",
        "device",
        "backend_version",
        "cpu",
        "gpu",
        "graph",
    ],
)
def test_timings_for_another_key_are_never_used(
    timed_plugins: Any, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    tune(_relu(), options={"threads": 1}, settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    model, options, device = _relu(), {"threads": 1}, None
    assert stored_measured(model, model.graph, device, options) is not None
    if change == "shapes":
        model = one_node_model("Relu", {"x": np.zeros((4, 3), np.float32)})
    elif change == "threads":
        options = {"threads": 2}
    elif change == "precision":
        options = {"threads": 1, "precision": "fp16"}
    elif change == "device":
        device = "cpu"  # the record was made for "auto", another request
    elif change == "backend_version":
        real = tuning.backend_versions
        monkeypatch.setattr(tuning, "backend_versions", lambda: {**real(), "fastlow": "9.9"})
    elif change == "cpu":
        monkeypatch.setattr(tuning, "cpu_info", OtherCpu)
    elif change == "gpu":
        monkeypatch.setattr(tuning, "accelerators", lambda: ["slowhigh cuda:0 NVIDIA H100"])
    elif change == "graph":
        model = one_node_model("Neg", {"x": X})
    assert stored_measured(model, model.graph, device, options) is None
    compiled = sdkit.compile(model, device=device, **options)
    assert compiled.backend_name == "wrong"  # the priority order, as if never tuned


@pytest.mark.parametrize(
    "content",
    [
        b"{ not json",
        b"\xff\xfe\x00",
        b"[]",
        b'{"key": {}, "results": "x"}',
        b"",
    ],
)
def test_a_corrupt_store_is_ignored_with_a_warning(timed_plugins: Any, content: bytes) -> None:
    result = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert result.path is not None
    result.path.write_bytes(content)
    with pytest.warns(UserWarning, match="ignoring the corrupt timings file"):
        compiled = sdkit.compile(_relu())
    assert compiled.backend_name == "wrong"  # priority, no crash
    # the next tune rewrites it
    again = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert again.path == result.path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sdkit.compile(_relu()).backend_name == "fastlow"


def test_a_record_with_tampered_fields_is_refused(timed_plugins: Any) -> None:
    result = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert result.path is not None
    data = json.loads(result.path.read_text())
    for tamper in (
        lambda d: d["results"][0].update(median_s="fast"),
        lambda d: d["results"][0].update(median_s=-1.0),
        lambda d: d["results"][0].update(agrees="yes"),
        lambda d: d["results"][0].update(extra=1),
        lambda d: d.update(tolerance=float("nan")),
        lambda d: d.pop("first"),
    ):
        broken = json.loads(json.dumps(data))
        tamper(broken)
        result.path.write_text(json.dumps(broken))
        with pytest.warns(UserWarning, match="corrupt"):
            assert sdkit.compile(_relu()).backend_name == "wrong"
    other_key = json.loads(json.dumps(data))
    other_key["key"]["graph"] = "0" * 64  # a record copied under another key's name
    result.path.write_text(json.dumps(other_key))
    with pytest.warns(UserWarning, match="holds another key"):
        assert sdkit.compile(_relu()).backend_name == "wrong"


def test_the_store_is_written_atomically(timed_plugins: Any, sdkit_isolated: Path) -> None:
    for _ in range(2):
        tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    folder = sdkit_isolated / "timings"
    assert [p.name.startswith(".tmp-") for p in folder.iterdir()] == [False]  # one file, no leftovers


def test_a_store_that_cannot_be_written_warns_and_still_chooses(timed_plugins: Any, sdkit_isolated: Path) -> None:
    sdkit_isolated.mkdir(parents=True, exist_ok=True)
    (sdkit_isolated / "timings").write_text("a file where the folder should be")
    with pytest.warns(UserWarning, match="the timings were not stored"):
        result = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert result.path is None and "cannot write timings" in result.store_error
    assert result.choice is not None and result.choice.backend.name == "fastlow"


def test_compile_with_tune_measures_once_then_reads_the_store(timed_plugins: Any) -> None:
    settings = _settings(timed_plugins, backends=("slowhigh", "fastlow"))
    compiled = sdkit.compile(_relu(), tune=settings)
    assert compiled.backend_name == "fastlow"
    assert timed_plugins.compiles == {"slowhigh": 1, "fastlow": 1}  # the measured fastlow is kept
    np.testing.assert_array_equal(compiled.run({"x": X})["out0"], np.maximum(X, 0))
    again = sdkit.compile(_relu(), tune=settings)
    assert again.backend_name == "fastlow"
    assert timed_plugins.compiles == {"slowhigh": 1, "fastlow": 2}  # no new measurement
    sdkit.compile(_relu(), tune=TuneSettings(clock=timed_plugins.clock, backends=("slowhigh", "fastlow"), force=True))
    assert timed_plugins.compiles == {"slowhigh": 2, "fastlow": 3}  # force: measured again


def test_tune_true_uses_the_default_settings(timed_plugins: Any) -> None:
    compiled = sdkit.compile(_relu(), tune=True)  # default backends: wrong is overruled
    assert compiled.backend_name in ("slowhigh", "fastlow")  # real clock: either may be faster
    assert len(list(tuning.timings_store().entries())) == 1


def test_explicit_backend_is_never_tuned(timed_plugins: Any) -> None:
    compiled = sdkit.compile(_relu(), backend="slowhigh", tune=True)
    assert compiled.backend_name == "slowhigh" and timed_plugins.compiles == {"slowhigh": 1}
    assert tuning.timings_store().entries() == []


def test_symbolic_model_is_tuned_per_input_signature_at_first_run(timed_plugins: Any) -> None:
    settings = _settings(timed_plugins, backends=("slowhigh", "fastlow"))
    compiled = sdkit.compile(_symbolic_relu(), tune=settings)
    assert isinstance(compiled, ShapeDeferred) and timed_plugins.compiles == {}
    for batch in (2, 5, 2):
        x = np.linspace(-1, 1, batch * 3, dtype=np.float32).reshape(batch, 3)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(x, 0))
        assert compiled.backend_name == "fastlow"
    assert [r.record.key["input_shapes"] for r in compiled.results] == [{"x": [2, 3]}, {"x": [5, 3]}]
    compiled.close()
    # a later compile without tune: the stored timings choose per signature
    plain = sdkit.compile(_symbolic_relu())
    assert isinstance(plain, ShapeDeferred)
    plain.run({"x": X})
    assert plain.backend_name == "fastlow"
    plain.run({"x": np.zeros((7, 3), np.float32)})  # a batch nobody tuned: priority
    assert plain.backend_name == "wrong"


def test_bad_requests_fail_before_timing(timed_plugins: Any) -> None:
    with pytest.raises(InputError, match="tuning needs every input's shape"):
        tune(_symbolic_relu(), settings=_settings(timed_plugins))
    with pytest.raises(UnknownBackendError, match="did you mean 'fastlow'"):
        tune(_relu(), settings=_settings(timed_plugins, backends=("fastlw",)))
    assert timed_plugins.compiles == {}


def test_a_backend_that_fails_is_recorded_not_raised(timed_plugins: Any) -> None:
    timed_plugins.fail.add("slowhigh")
    result = tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh", "fastlow")))
    assert result.record.result("slowhigh").error == "RuntimeError: plugin bug"
    assert result.record.first == "fastlow"
    assert result.choice is not None and result.choice.backend.name == "fastlow"
    timed_plugins.fail.clear()
    choice = sdkit.choose_backend(_relu())
    assert choice.backend == "fastlow"
    assert dict(choice.rejected)["slowhigh"].startswith("failed: RuntimeError: plugin bug (tuned ")


def _two_devices(timed: Any, monkeypatch: pytest.MonkeyPatch, gpu_cost: float) -> None:
    """``slowhigh`` lists ``cuda:0`` and ``cpu`` (as ggml does with a CUDA build); on ``cuda:0``
    a run costs ``gpu_cost`` instead of its 3 s."""
    from sdkit.device import Device
    from sdkit.plugins import get_plugins

    cls = get_plugins().backends.get("slowhigh")
    assert cls is not None
    compile_on = cls.compile
    monkeypatch.setattr(cls, "devices", lambda self: [Device("cuda", 0, "Fake GPU"), Device("cpu")])

    def compile_timed(self: Any, graph: Any, weights: Any, device: Any, options: Any) -> Any:
        compiled = compile_on(self, graph, weights, Device("cpu"), options)
        compiled.device = device
        if device.kind == "cuda":
            execute = compiled.execute

            def faster(feeds: Any) -> Any:
                out = execute(feeds)
                timed.clock.now -= timed.cost["slowhigh"] - gpu_cost
                return out

            compiled.execute = faster
        return compiled

    monkeypatch.setattr(cls, "compile", compile_timed)


def test_a_tune_without_a_device_compares_each_device_of_a_backend(
    timed_plugins: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_devices(timed_plugins, monkeypatch, gpu_cost=0.25)
    timed_plugins.scale["wrong"] = 1.0  # every fake agrees here: the choice is speed alone
    assert default_backends(None) == ["wrong", "slowhigh@cuda:0", "slowhigh@cpu", "fastlow"]
    assert default_backends("cpu") == ["wrong", "slowhigh", "fastlow"]  # a device asked for: one each
    result = tune(_relu(), settings=_settings(timed_plugins))
    medians = {m.backend: m.median_s for m in result.record.results}
    assert medians == pytest.approx({"wrong": 0.5, "slowhigh@cuda:0": 0.25, "slowhigh@cpu": 3.0, "fastlow": 1.0})
    assert result.record.result("slowhigh@cuda:0").device == "cuda:0"
    assert result.choice is not None and result.choice.name == "slowhigh@cuda:0"
    # auto now takes the backend and the device it was fastest on, and says why the rest lost
    choice = sdkit.choose_backend(_relu())
    assert (choice.backend, str(choice.device)) == ("slowhigh", "cuda:0")
    assert choice.reason.startswith("measured fastest: 0.25 s median")
    why = dict(choice.rejected)
    assert why["slowhigh@cpu"] == "measured slower: 3 s median, 12.00x slowhigh@cuda:0's"
    assert why["wrong"] == "measured slower: 0.5 s median, 2.00x slowhigh@cuda:0's"


def test_the_cpu_device_is_chosen_where_it_measured_faster(timed_plugins: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _two_devices(timed_plugins, monkeypatch, gpu_cost=9.0)
    tune(_relu(), settings=_settings(timed_plugins, backends=("slowhigh@cuda:0", "slowhigh@cpu")))
    choice = sdkit.choose_backend(_relu())
    assert (choice.backend, str(choice.device)) == ("slowhigh", "cpu")
    assert dict(choice.rejected)["slowhigh@cuda:0"].startswith("measured slower: 9 s median")
