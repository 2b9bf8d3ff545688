"""The GPU backends ``native_build`` can add to ggml (``--cuda``, ``--vulkan``): per backend, its
CMake definitions and a pre-flight that names every missing tool before anything is
downloaded or compiled.

Each backend is one :class:`GpuBackend`: ``check(options)`` returns ``(flags, missing)``, the
CMake definitions of the build and one line per missing thing, saying how to get it. The
build refuses to start while any line is left (:func:`preflight` joins them with the general
tools, CMake and a C/C++ compiler, into one message).

CUDA needs ``nvcc`` (the CUDA toolkit) and cuBLAS (headers and libraries: the toolkit's own, or
a prefix given with ``--cublas`` such as the ``nvidia-cublas`` wheel's ``nvidia/cu13`` folder,
which is also found by itself in this interpreter's site-packages). The GPU architecture is
``--cuda-arch`` or this machine's GPUs' compute capability (``nvidia-smi``). Vulkan needs
``glslc``, the Vulkan loader, Vulkan headers with ``VK_EXT_layer_settings`` (ggml 0.20.2 uses
``vk::LayerSettingEXT``: Vulkan-Headers 1.3.261 or newer; Debian bookworm's 1.3.239 is too
old) and SPIRV-Headers' CMake package; ``--vulkan-sdk PREFIX`` (or ``VULKAN_SDK``) names a
prefix holding ``include/vulkan`` and ``share/cmake/SPIRV-Headers``.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

Check = tuple[list[str], list[str]]  # (CMake flags, missing items)


@dataclass(frozen=True)
class GpuOptions:
    """What the command line says about the GPU toolchains (None: find it)."""

    cuda_root: Path | None = None
    cublas: Path | None = None
    cuda_arch: str | None = None
    vulkan_sdk: Path | None = None


@dataclass(frozen=True)
class GpuBackend:
    name: str  # "cuda": the record's name and the device prefix ggml gives (cuda:N)
    option: str  # the command-line switch
    check: Callable[[GpuOptions], Check]


def _which(tool: str, *dirs: Path | None) -> Path | None:
    for folder in dirs:
        if folder is not None and (folder / tool).is_file():
            return folder / tool
    found = shutil.which(tool)
    return Path(found) if found else None


def missing_general_tools() -> list[str]:
    """CMake and a C/C++ compiler, needed by every build."""
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake: install CMake >= 3.18 (`pip install cmake`, or apt-get install cmake)")
    if not (os.environ.get("CC") or any(shutil.which(c) for c in ("cc", "gcc", "clang"))):
        missing.append("a C compiler: install gcc or clang (apt-get install build-essential), or set CC")
    if not (os.environ.get("CXX") or any(shutil.which(c) for c in ("c++", "g++", "clang++"))):
        missing.append("a C++ compiler: install g++ or clang++ (apt-get install build-essential), or set CXX")
    return missing


# --- CUDA -------------------------------------------------------------------------------------


def nvcc_major(nvcc: Path) -> int | None:
    """The CUDA release of ``nvcc`` ("Cuda compilation tools, release 13.0, ..." -> 13)."""
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+)\.", text)
    return int(match[1]) if match else None


def local_compute_caps() -> list[str]:
    """This machine's NVIDIA GPUs' compute capabilities as CMake architectures ("9.0" -> "90")."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    caps = [line.strip().replace(".", "") for line in out.stdout.splitlines() if re.fullmatch(r"\s*\d+\.\d+\s*", line)]
    return sorted(set(caps))


def wheel_prefixes() -> list[Path]:
    """The CUDA library wheels' prefixes in this interpreter (``nvidia/cu13``, ``nvidia/cublas``)."""
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    found: list[Path] = []
    for root in dict.fromkeys(roots):
        nvidia = Path(root) / "nvidia"
        if nvidia.is_dir():
            found += sorted(p for p in nvidia.iterdir() if (p / "include" / "cublas_v2.h").is_file())
    return found


def cublas_library(prefix: Path, major: int | None) -> Path | None:
    """``libcublas.so`` (or ``.so.<major>``) under ``prefix``'s lib folders."""
    for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        folder = prefix / lib
        names = ["libcublas.so", *([f"libcublas.so.{major}"] if major else []), "cublas.lib"]
        for name in names:
            if (folder / name).is_file():
                return folder / name
        if major is None:
            any_version = sorted(folder.glob("libcublas.so.*"))
            if any_version:
                return any_version[0]
    return None


def cublas_include(prefix: Path) -> Path | None:
    for inc in ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include"):
        if (prefix / inc / "cublas_v2.h").is_file():
            return prefix / inc
    return None


def _cublas_flags(prefix: Path, include: Path, library: Path, toolkit: Path | None) -> list[str]:
    if toolkit is not None and prefix == toolkit:
        return []  # the toolkit's own cuBLAS: CMake's FindCUDAToolkit finds it
    lt = library.with_name(library.name.replace("libcublas", "libcublasLt"))
    flags = [f"-DCUDA_cublas_LIBRARY={library}", f"-DCMAKE_CUDA_FLAGS=-I{include}", f"-DCMAKE_CXX_FLAGS=-I{include}"]
    return [*flags, f"-DCUDA_cublasLt_LIBRARY={lt}"] if lt.is_file() else flags


def toolkit_root(nvcc: Path) -> Path | None:
    """The toolkit ``nvcc`` belongs to (the folder holding include/cuda_runtime.h); ``nvcc`` may
    be a wrapper script elsewhere (``/usr/local/bin/nvcc`` exec'ing ``/usr/local/cuda-13.0``'s)."""
    for root in (nvcc.resolve().parent.parent, Path("/usr/local/cuda")):
        if (root / "include" / "cuda_runtime.h").is_file() or any(root.glob("targets/*/include/cuda_runtime.h")):
            return root
    return None


def driver_library(toolkit: Path | None) -> Path | None:
    """libcuda (ggml-cuda links the driver API for its memory pool): the driver's, else the
    toolkit's link stub."""
    system = [p / d for p in SYSTEM_PREFIXES for d in _LIB_DIRS] + [Path("/usr/lib/wsl/lib")]
    stubs = [toolkit / d / "stubs" for d in ("lib64", "lib", "targets/x86_64-linux/lib")] if toolkit else []
    return _first(folder / name for folder in [*system, *stubs] for name in ("libcuda.so", "libcuda.so.1"))


def check_cuda(options: GpuOptions) -> Check:
    missing: list[str] = []
    root = options.cuda_root or (Path(os.environ["CUDA_PATH"]) if os.environ.get("CUDA_PATH") else None)
    nvcc = _which("nvcc", root / "bin" if root else None)
    flags = ["-DGGML_CUDA=ON"]
    if nvcc is None:
        missing.append(
            "nvcc: install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) "
            "or pass --cuda-root PREFIX (the folder holding bin/nvcc)"
        )
    else:
        root = root or toolkit_root(nvcc)
        real = root / "bin" / "nvcc" if root and (root / "bin" / "nvcc").is_file() else nvcc
        flags += [*([f"-DCUDAToolkit_ROOT={root}"] if root else []), f"-DCMAKE_CUDA_COMPILER={real}"]
    major = nvcc_major(nvcc) if nvcc else None
    candidates = [options.cublas] if options.cublas else [p for p in (root,) if p] + wheel_prefixes()
    for prefix in candidates:
        include, library = cublas_include(prefix), cublas_library(prefix, major)
        if include and library:
            flags += _cublas_flags(prefix, include, library, root)
            break
    else:
        where = f" in {options.cublas}" if options.cublas else ""
        version = f"{major}.x" if major else "of your nvcc's CUDA release"
        missing.append(
            f"cuBLAS{where} (cublas_v2.h and libcublas.so): install the toolkit's cuBLAS, or "
            f"`pip install nvidia-cublas` ({version}) and pass --cublas <site-packages>/nvidia/cu{major or 'NN'}"
        )
    driver = driver_library(root)
    if driver is None:
        missing.append(
            "the CUDA driver library (libcuda.so): install the NVIDIA driver, or the toolkit's stubs "
            "(<toolkit>/lib64/stubs/libcuda.so, package cuda-driver-dev)"
        )
    else:
        flags.append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    arch = options.cuda_arch or ";".join(local_compute_caps())
    if arch:
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    else:
        missing.append(
            "the GPU architecture: nvidia-smi sees no GPU here; pass --cuda-arch (e.g. 86, 89, 90, "
            "120; 'native' for the GPUs at build time; several as '86;90')"
        )
    return flags, missing


# --- Vulkan -----------------------------------------------------------------------------------

SYSTEM_PREFIXES = (Path("/usr"), Path("/usr/local"))
_LIB_DIRS = ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")
_SPIRV_DIRS = ("share/cmake/SPIRV-Headers", "lib/cmake/SPIRV-Headers", "lib/x86_64-linux-gnu/cmake/SPIRV-Headers")


def _first(paths: Iterable[Path]) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def vulkan_header_problem(header: Path) -> str:
    """Why ``vulkan_core.h`` is too old for ggml-vulkan ("" when it is new enough)."""
    text = header.read_text(errors="replace")
    if "VK_EXT_layer_settings" in text:
        return ""
    version = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    return f"1.3.{version[1]}" if version else "of an unknown version"


def spirv_config_dir(prefixes: Iterable[Path]) -> Path | None:
    """The folder of SPIRV-Headers' CMake package under the first of ``prefixes`` that has one."""
    found = _first(p / d / "SPIRV-HeadersConfig.cmake" for p in prefixes for d in _SPIRV_DIRS)
    return found.parent if found else None


def check_vulkan(options: GpuOptions) -> Check:
    sdk = options.vulkan_sdk or (Path(os.environ["VULKAN_SDK"]) if os.environ.get("VULKAN_SDK") else None)
    prefixes = [sdk] if sdk else []
    prefixes += list(SYSTEM_PREFIXES)
    missing: list[str] = []
    flags = ["-DGGML_VULKAN=ON"]
    if _which("glslc", sdk / "bin" if sdk else None) is None:
        missing.append("glslc: apt-get install glslc (or the LunarG Vulkan SDK; --vulkan-sdk PREFIX with bin/glslc)")
    system_first = [*SYSTEM_PREFIXES, *prefixes[: -len(SYSTEM_PREFIXES)]]  # keep the system's loader
    loader = _first(p / d / n for p in system_first for d in _LIB_DIRS for n in ("libvulkan.so", "libvulkan.so.1"))
    if loader is None:
        missing.append("the Vulkan loader (libvulkan.so): apt-get install libvulkan-dev (or libvulkan1)")
    else:
        flags.append(f"-DVulkan_LIBRARY={loader}")
    header = _first(p / "include" / "vulkan" / "vulkan_core.h" for p in prefixes)
    problem = vulkan_header_problem(header) if header else "absent"
    if problem:
        seen = f"{header} is {problem}" if header else "no include/vulkan/vulkan_core.h"
        missing.append(
            f"Vulkan headers with VK_EXT_layer_settings (1.3.261 or newer; {seen}): Debian trixie's "
            "libvulkan-dev or the LunarG SDK, then --vulkan-sdk PREFIX (the folder holding include/vulkan)"
        )
    elif header is not None:
        flags.append(f"-DVulkan_INCLUDE_DIR={header.parent.parent}")
    spirv = spirv_config_dir(prefixes)
    if spirv is None:
        missing.append(
            "SPIRV-Headers' CMake package (SPIRV-HeadersConfig.cmake): apt-get install spirv-headers, "
            "or --vulkan-sdk PREFIX holding share/cmake/SPIRV-Headers"
        )
    else:
        flags.append(f"-DSPIRV-Headers_DIR={spirv}")
    return flags, missing


BACKENDS = (GpuBackend("cuda", "--cuda", check_cuda), GpuBackend("vulkan", "--vulkan", check_vulkan))


def preflight(backends: Iterable[GpuBackend], options: GpuOptions) -> list[str]:
    """The GPU backends' CMake flags; SystemExit naming everything missing, one line each."""
    missing = missing_general_tools()
    flags: list[str] = []
    for backend in backends:
        more, lacking = backend.check(options)
        flags += more
        missing += [f"{backend.option}: {line}" for line in lacking]
    if missing:
        lines = "\n".join(f"  - {line}" for line in missing)
        raise SystemExit(f"cannot build ggml here, missing:\n{lines}")
    return flags
