"""native_build --cuda / --vulkan: each backend's CMake flags and the pre-flight that names every
missing tool at once, on fake toolchains (folders with the files CMake would look for); no
compiler runs. The configure with these flags was proven by hand (benchmarks/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sdkit_ggml.runtime import gpu_build, native, native_build
from sdkit_ggml.runtime.gpu_build import GpuOptions, check_cuda, check_vulkan, preflight

NEW_HEADER = "#define VK_HEADER_VERSION 309\n#define VK_EXT_layer_settings 1\n"
OLD_HEADER = "#define VK_HEADER_VERSION 239\n"


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def no_tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No tool on PATH, no system prefix, no GPU, no CUDA wheel: every check starts from nothing."""
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(gpu_build, "SYSTEM_PREFIXES", (tmp_path / "usr",))
    monkeypatch.setattr(gpu_build, "wheel_prefixes", list)
    monkeypatch.setattr(gpu_build, "local_compute_caps", list)
    monkeypatch.setattr(gpu_build, "nvcc_major", lambda nvcc: 13)
    for var in ("CC", "CXX", "CUDA_PATH", "VULKAN_SDK"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def fake_toolkit(root: Path, with_cublas: bool) -> Path:
    touch(root / "bin" / "nvcc")
    touch(root / "include" / "cuda_runtime.h")
    touch(root / "lib64" / "stubs" / "libcuda.so")
    if with_cublas:
        touch(root / "include" / "cublas_v2.h")
        touch(root / "lib64" / "libcublas.so")
    return root


def test_nothing_installed_names_every_missing_item_at_once(no_tools: Path) -> None:
    backends = list(gpu_build.BACKENDS)
    with pytest.raises(SystemExit) as exc:
        preflight(backends, GpuOptions())
    message = str(exc.value)
    for item in ("cmake", "a C compiler", "a C++ compiler", "--cuda: nvcc", "--cuda: cuBLAS", "--cuda: the GPU arch",
                 "--cuda: the CUDA driver library",
                 "--vulkan: glslc", "--vulkan: the Vulkan loader", "--vulkan: Vulkan headers",
                 "--vulkan: SPIRV-Headers"):  # fmt: skip
        assert item in message
    assert len(message.splitlines()) == 12  # the title and one line per missing item


def test_cuda_with_the_toolkits_cublas_and_the_local_gpus_arch(no_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_toolkit(no_tools / "cuda", with_cublas=True)
    monkeypatch.setattr(gpu_build, "local_compute_caps", lambda: ["90"])
    flags, missing = check_cuda(GpuOptions(cuda_root=root))
    assert missing == []
    assert flags == [
        "-DGGML_CUDA=ON",
        f"-DCUDAToolkit_ROOT={root}",
        f"-DCMAKE_CUDA_COMPILER={root}/bin/nvcc",
        f"-DCUDA_cuda_driver_LIBRARY={root}/lib64/stubs/libcuda.so",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
    ]


def test_cuda_with_cublas_from_the_wheel_and_a_given_arch(no_tools: Path) -> None:
    root = fake_toolkit(no_tools / "cuda", with_cublas=False)
    wheel = no_tools / "site" / "nvidia" / "cu13"  # nvidia-cublas 13.x: versioned names only
    touch(wheel / "include" / "cublas_v2.h")
    touch(wheel / "lib" / "libcublas.so.13")
    touch(wheel / "lib" / "libcublasLt.so.13")
    flags, missing = check_cuda(GpuOptions(cuda_root=root, cublas=wheel, cuda_arch="86;90"))
    assert missing == []
    assert f"-DCUDA_cublas_LIBRARY={wheel}/lib/libcublas.so.13" in flags
    assert f"-DCUDA_cublasLt_LIBRARY={wheel}/lib/libcublasLt.so.13" in flags
    assert f"-DCMAKE_CUDA_FLAGS=-I{wheel}/include" in flags
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in flags


def test_a_cublas_of_another_cuda_release_is_not_taken(no_tools: Path) -> None:
    root = fake_toolkit(no_tools / "cuda", with_cublas=False)
    wheel = no_tools / "site" / "nvidia" / "cublas"
    touch(wheel / "include" / "cublas_v2.h")
    touch(wheel / "lib" / "libcublas.so.12")  # nvcc says 13
    _, missing = check_cuda(GpuOptions(cuda_root=root, cublas=wheel, cuda_arch="90"))
    assert len(missing) == 1 and missing[0].startswith(f"cuBLAS in {wheel}") and "nvidia/cu13" in missing[0]


def test_compute_caps_read_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    class Done:
        stdout = "9.0\n9.0\n8.6\n"

    monkeypatch.setattr(shutil, "which", lambda tool: "/usr/bin/nvidia-smi" if tool == "nvidia-smi" else None)
    monkeypatch.setattr(gpu_build.subprocess, "run", lambda *a, **k: Done())
    assert gpu_build.local_compute_caps() == ["86", "90"]


def vulkan_prefix(root: Path, header: str) -> Path:
    touch(root / "include" / "vulkan" / "vulkan_core.h", header)
    touch(root / "share" / "cmake" / "SPIRV-Headers" / "SPIRV-HeadersConfig.cmake")
    return root


def test_vulkan_headers_too_old_are_named_with_their_version(no_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = vulkan_prefix(no_tools / "usr", OLD_HEADER)
    touch(system / "lib" / "x86_64-linux-gnu" / "libvulkan.so.1")
    monkeypatch.setattr(shutil, "which", lambda tool: "/usr/bin/glslc" if tool == "glslc" else None)
    flags, missing = check_vulkan(GpuOptions())
    assert len(missing) == 1 and "vulkan_core.h is 1.3.239" in missing[0] and "--vulkan-sdk" in missing[0]
    assert f"-DVulkan_LIBRARY={system}/lib/x86_64-linux-gnu/libvulkan.so.1" in flags


def test_vulkan_sdk_prefix_gives_headers_and_spirv_but_the_system_loader_is_kept(
    no_tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = vulkan_prefix(no_tools / "usr", OLD_HEADER)
    touch(system / "lib" / "x86_64-linux-gnu" / "libvulkan.so")
    sdk = vulkan_prefix(no_tools / "vksdk", NEW_HEADER)
    touch(sdk / "bin" / "glslc")
    touch(sdk / "lib" / "libvulkan.so")
    monkeypatch.setenv("VULKAN_SDK", str(sdk))
    flags, missing = check_vulkan(GpuOptions())
    assert missing == []
    assert flags == [
        "-DGGML_VULKAN=ON",
        f"-DVulkan_LIBRARY={system}/lib/x86_64-linux-gnu/libvulkan.so",
        f"-DVulkan_INCLUDE_DIR={sdk}/include",
        f"-DSPIRV-Headers_DIR={sdk}/share/cmake/SPIRV-Headers",
    ]


def test_the_command_refuses_before_any_download(no_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*args: object) -> Path:
        raise AssertionError("downloaded before the pre-flight")

    monkeypatch.setattr(native_build, "download_sdist", no_download)
    with pytest.raises(SystemExit, match=r"(?s)missing:.*cmake.*--vulkan: glslc"):
        native_build.main(["--vulkan", "--dest", str(no_tools / "out")])


def test_sources_given_as_a_folder_or_of_another_release(tmp_path: Path) -> None:
    unpacked = tmp_path / "libggml_python-0.20.2.post1"
    touch(unpacked / "ggml" / "CMakeLists.txt")
    touch(unpacked / "ggml" / "src" / "ggml.c")
    assert native_build.local_sources(unpacked, "0.20.2.post1", tmp_path / "x") == unpacked / "ggml"
    with pytest.raises(SystemExit, match=r"is libggml-python 0\.20\.2\.post1, 0\.20\.3 is installed"):
        native_build.local_sources(unpacked, "0.20.3", tmp_path / "x")
    with pytest.raises(SystemExit, match="holds no ggml sources"):
        native_build.local_sources(tmp_path, "0.20.2.post1", tmp_path / "x")
    with pytest.raises(SystemExit, match="no such file"):
        native_build.local_sources(tmp_path / "absent.tar.gz", "0.20.2.post1", tmp_path / "x")


def test_the_record_says_which_gpu_backends_the_build_has(tmp_path: Path) -> None:
    native.write_record(tmp_path, "0.20.2.post1", ["-DGGML_CUDA=ON"], ["cuda"])
    assert json.loads((tmp_path / native.RECORD).read_text())["gpu_backends"] == ["cuda"]
    assert native.gpu_backends_of(tmp_path) == ["cuda"]
    assert native.gpu_backends_of(tmp_path / "none") == []


def test_unversioned_names_added_for_every_library(tmp_path: Path) -> None:
    for name in ("libggml.so.0.9.4", "libggml-cuda.so.0.9.4", "libggml-base.so", "libggml-base.so.0.9.4"):
        touch(tmp_path / name, name)
    native_build.add_unversioned_names(tmp_path)
    assert (tmp_path / "libggml-cuda.so").read_text() == "libggml-cuda.so.0.9.4"
    assert (tmp_path / "libggml.so").is_file() and (tmp_path / "libggml-base.so").read_text() == "libggml-base.so"


def test_check_stops_after_the_preflight_and_the_sources(
    no_tools: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_build, "missing_general_tools", list)
    monkeypatch.setattr(native_build, "missing_general_tools", list)
    monkeypatch.setattr(native_build.importlib.metadata, "version", lambda name: "0.20.2.post1")
    root = fake_toolkit(no_tools / "cuda", with_cublas=True)
    unpacked = no_tools / "libggml_python-0.20.2.post1"
    touch(unpacked / "ggml" / "CMakeLists.txt")
    touch(unpacked / "ggml" / "src" / "ggml.c")
    argv = ["--cuda", "--cuda-root", str(root), "--cuda-arch", "90", "--sources", str(unpacked), "--check"]
    assert native_build.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("ready to build ggml of libggml-python 0.20.2.post1 with:")
    assert "-DGGML_CUDA=ON" in out and "-DCMAKE_CUDA_ARCHITECTURES=90" in out
