"""Registration through core's hooks, the engine in ``sdkit backends``, and the one clear error for
each way the engine cannot run: binding missing, built without the device asked for, a graph
backend named for a GGUF file, an option sd.cpp has no use for, a file it does not read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdcpp_helpers import needs_binding

import sdkit
from sdkit.cli.main import main
from sdkit.errors import BackendUnavailableError, ModelFormatError, OptionError
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.plugins import get_plugins
from sdkit.testing.gguf_files import write_gguf
from sdkit_sdcpp import binding
from sdkit_sdcpp.loader import SdcppLoader
from sdkit_sdcpp.pipeline import SdcppPipeline

SD1 = {"model.diffusion_model.input_blocks.0.0.weight": ((320, 4, 3, 3), "f16")}


def _no_binding(monkeypatch: pytest.MonkeyPatch, installed: str | None = None) -> None:
    real = binding.importlib.import_module

    def refuse(name: str, *args: Any) -> Any:
        if name == "stable_diffusion_cpp":
            raise ImportError("No module named 'stable_diffusion_cpp'")
        return real(name, *args)

    monkeypatch.setattr(binding.importlib, "import_module", refuse)
    monkeypatch.setattr(binding, "installed_version", lambda: installed)


def _build(monkeypatch: pytest.MonkeyPatch, *backends: str) -> None:
    info = binding.BuildInfo("0.4.7", "test", backends, "AVX2 = 1")
    monkeypatch.setattr(binding, "build_info", lambda: info)


def test_registered_through_the_loader_hook() -> None:
    plugins = get_plugins()
    assert plugins.loaders.get("sdcpp") is SdcppLoader
    assert plugins.loaders.owner("sdcpp") == "sdcpp"


def test_hooks_import_no_binding() -> None:
    code = (
        "import sys; from sdkit.plugins import get_plugins; get_plugins(); import sdkit_sdcpp.loader; "
        "print('stable_diffusion_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_gguf_files_are_its_own_and_others_only_by_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "model.gguf", SD1)
    assert pipeline_class_for(path) is SdcppPipeline
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert pipeline_class_for(checkpoint, "sdcpp") is SdcppPipeline
    assert pipeline_class_for(tmp_path, "sdcpp") is None
    with pytest.raises(ModelFormatError, match=r"is a folder: stable-diffusion.cpp reads single files"):
        sdkit.load_pipeline(tmp_path, backend="sdcpp")


def test_a_damaged_gguf_is_refused_as_gguf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ``.gguf`` file whose first bytes are not GGUF's magic is refused as a GGUF file (the
    second bad-input pass found it reported as "not a safetensors file")."""
    path = write_gguf(tmp_path / "model.gguf", SD1)
    path.write_bytes(b"GGUX" + path.read_bytes()[4:])
    _build(monkeypatch, "CPU")
    with pytest.raises(ModelFormatError, match=r"model.gguf is not a GGUF file \(no GGUF magic\)"):
        sdkit.load_pipeline(path, backend="sdcpp")


def test_backends_lists_the_engine(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _build(monkeypatch, "CPU", "Vulkan")
    assert main(["backends", "--json"]) == 0
    row = next(b for b in json.loads(capsys.readouterr().out)["backends"] if b["name"] == "sdcpp")
    assert row["available"] and row["devices"] == ["vulkan:0"] and row["plugin"] == "sdcpp"
    assert row["reason"] == "stable-diffusion.cpp built for CPU+Vulkan"
    assert main(["devices"]) == 0
    assert "vulkan:0" in capsys.readouterr().out


def test_missing_binding_is_one_error_with_the_build_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_binding(monkeypatch)
    path = write_gguf(tmp_path / "model.gguf", SD1)
    with pytest.raises(BackendUnavailableError, match="stable-diffusion-cpp-python is not installed") as info:
        sdkit.load_pipeline(path)
    assert "pip install --no-binary stable-diffusion-cpp-python" in info.value.install_hint
    assert main(["backends", "--json"]) == 0
    row = next(b for b in json.loads(capsys.readouterr().out)["backends"] if b["name"] == "sdcpp")
    assert not row["available"] and row["install_hint"] == binding.install_hint()
    assert main(["generate", "--model", str(path), "a cat", "-o", str(tmp_path / "x.png")]) == 1
    assert "stable-diffusion-cpp-python is not installed" in capsys.readouterr().err


def test_a_broken_binding_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_binding(monkeypatch, installed="0.4.7")
    with pytest.raises(BackendUnavailableError, match=r"0.4.7 is installed but does not load"):
        sdkit.load_pipeline(write_gguf(tmp_path / "model.gguf", SD1))


@pytest.mark.parametrize(
    ("backends", "device", "message", "flag"),
    [
        (("CPU",), "cuda:0", "built without cuda", "-DSD_CUDA=ON"),
        (("CPU",), "vulkan", "built without vulkan", "-DSD_VULKAN=ON"),
        (("CPU", "CUDA"), "cpu", "built for cuda and runs the model there", ""),
        (("CPU", "Metal"), "cuda", r"built without cuda \(its ggml backends: CPU, Metal\)", "-DSD_CUDA=ON"),
    ],
)
def test_a_device_the_build_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backends: tuple[str, ...], device: str, message: str, flag: str
) -> None:
    _build(monkeypatch, *backends)
    with pytest.raises(BackendUnavailableError, match=message) as info:
        sdkit.load_pipeline(write_gguf(tmp_path / "model.gguf", SD1), device=device)
    assert flag in info.value.install_hint


def test_vulkan_device_index_goes_to_sd_vk_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _build(monkeypatch, "CPU", "Vulkan")
    assert binding.check_device("vulkan:1") == {"SD_VK_DEVICE": "1"}
    assert binding.check_device(None) == {}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"backend": "ggml"}, OptionError, r"\(backend='sdcpp' or 'auto'\), not on 'ggml'"),
        ({"cache": False}, OptionError, "stable-diffusion.cpp takes no option 'cache'"),
        ({"precision": "int8"}, OptionError, "precision 'int8'"),
        ({"prediction": "v"}, OptionError, "prediction: stable-diffusion.cpp reads"),
        ({"device": {"unet": "cpu"}}, OptionError, "one device, not per component"),
        ({"clip_l": "missing.safetensors"}, ModelFormatError, "clip_l: no such file"),
    ],
)
def test_refusals_at_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    _build(monkeypatch, "CPU")
    with pytest.raises(error, match=message):
        sdkit.load_pipeline(write_gguf(tmp_path / "model.gguf", SD1), prepare=False, **kwargs)


def test_a_per_component_sdcpp_is_refused_naming_the_engine() -> None:
    from sdkit.selection import get_backend

    with pytest.raises(OptionError, match="runs whole pipelines, not single graphs"):
        get_backend("sdcpp")


def test_a_missing_plugin_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sdkit import known_backends
    from sdkit import plugins as plugins_module
    from sdkit.plugins import Plugins

    monkeypatch.setattr(plugins_module.manager, "_plugins", Plugins([]))
    monkeypatch.setattr(known_backends, "installed_version", lambda d: None)
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(BackendUnavailableError, match="plugin sdkit-sdcpp is not installed"):
        sdkit.load_pipeline(checkpoint, backend="sdcpp")


@needs_binding
def test_a_file_sdcpp_cannot_load_is_refused_and_the_process_lives_on() -> None:
    """sd.cpp returns a NULL context for a file it cannot read (a narrow model: its layer widths
    are fixed); the binding's object would free it when collected and segfault (found by
    ``sdkit tune`` trying sd.cpp on such a file)."""
    tiny = Path(__file__).resolve().parents[3] / "fixtures" / "families" / "tiny" / "sd1" / "sd1_fp32.safetensors"
    code = (
        "import gc, sys, sdkit\nfrom sdkit.errors import ModelFormatError\n"
        "try:\n    sdkit.load_pipeline(sys.argv[1], backend='sdcpp')\n"
        "except ModelFormatError as exc:\n    print('refused:', exc)\n"
        "gc.collect()\nprint('alive')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tiny)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: stable-diffusion.cpp cannot load sd1_fp32.safetensors" in done.stdout
    assert done.stdout.rstrip().endswith("alive")
