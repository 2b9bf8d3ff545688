"""stable-diffusion-cpp-python, imported on first use, and what its build can run on.

The binding is built from its sdist (PyPI has no wheels): its CMake options choose the GPU API
compiled into stable-diffusion.cpp's ggml (``CMAKE_ARGS="-DSD_CUDA=ON"``, ``-DSD_VULKAN=ON``,
``-DSD_METAL=ON``, ``-DSD_HIPBLAS=ON``). Which one a build has is read from the library itself: ggml
is linked into ``libstable-diffusion`` and its device registry (``ggml_backend_reg_*``) is exported,
so ``build_backends`` lists the registered ggml backends (``CPU``, ``CUDA``, ``Vulkan``, ``Metal``...)
without creating a model. Nothing here runs at import time.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from sdkit.device import Device
from sdkit.errors import BackendUnavailableError

DISTRIBUTION = "stable-diffusion-cpp-python"
ENGINE = "sdcpp"
TESTED = "0.4.7"  # the ctypes structs the binding passes change between releases
# What each ggml backend registry name (``ggml_backend_reg_name``) is as an sdkit device kind, and
# the CMake flag that builds it into stable-diffusion.cpp.
GGML_KINDS = {"CPU": "cpu", "CUDA": "cuda", "ROCm": "rocm", "Vulkan": "vulkan", "Metal": "metal", "SYCL": "sycl"}
CMAKE_FLAGS = {
    "cuda": "-DSD_CUDA=ON",
    "vulkan": "-DSD_VULKAN=ON",
    "metal": "-DSD_METAL=ON",
    "rocm": "-DSD_HIPBLAS=ON",
    "sycl": "-DSD_SYCL=ON",
}


def install_hint(kind: str = "cpu") -> str:
    """The command that builds the binding for ``kind`` (``cpu``, ``cuda``, ``vulkan``...)."""
    flag = CMAKE_FLAGS.get(kind)
    prefix = f'CMAKE_ARGS="{flag}" ' if flag else ""
    return (
        f"{prefix}pip install --no-binary {DISTRIBUTION} --force-reinstall --no-deps "
        f'"{DISTRIBUTION}>={TESTED},<0.5" (builds stable-diffusion.cpp: CMake and a C++ compiler; '
        "see sdkit-sdcpp's README)"
    )


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


_HANDLES: list[ctypes.CDLL] = []


def _bind_deep() -> None:
    """Load the binding's library so it keeps its own ggml (Linux: ``RTLD_DEEPBIND``).

    ``libstable-diffusion`` links ggml in and exports its symbols; when another ggml is already in
    the process's global scope (sdkit-ggml loads libggml-python's with ``RTLD_GLOBAL``), the
    dynamic linker would resolve sd.cpp's own ggml calls to that other ggml: another version,
    other kernels (measured: the same request gave other pixels). Loaded first with
    ``RTLD_DEEPBIND``, the library looks up its own symbols before the global ones; the binding's
    ``CDLL`` of the same path then gets this handle."""
    if _HANDLES or not hasattr(os, "RTLD_DEEPBIND"):
        return
    spec = importlib.util.find_spec("stable_diffusion_cpp")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = sorted(p for folder in folders for p in (Path(folder) / "lib").glob("libstable-diffusion*.so*"))
    if found:
        _HANDLES.append(ctypes.CDLL(str(found[0]), mode=os.RTLD_DEEPBIND | os.RTLD_NOW | os.RTLD_LOCAL))


def import_binding() -> ModuleType:
    """The ``stable_diffusion_cpp`` module, or a ``BackendUnavailableError`` saying how to build it."""
    try:
        _bind_deep()
        return importlib.import_module("stable_diffusion_cpp")
    except ImportError as exc:
        version = installed_version()
        if version is None:
            reason = f"{DISTRIBUTION} is not installed"
        else:  # installed, but its native library did not load (a failed or foreign build)
            reason = f"{DISTRIBUTION} {version} is installed but does not load: {exc}"
        raise BackendUnavailableError(ENGINE, reason, install_hint()) from None
    except OSError as exc:  # the shared library itself failed to load
        raise BackendUnavailableError(
            ENGINE, f"{DISTRIBUTION}'s library does not load: {exc}", install_hint()
        ) from None


@dataclass(frozen=True)
class BuildInfo:
    """What the loaded build is: binding and stable-diffusion.cpp versions, the ggml backends
    compiled in (``CPU``, ``Vulkan``...) and the CPU features it was compiled for."""

    version: str
    sdcpp_version: str
    backends: tuple[str, ...]
    system_info: str

    @property
    def kinds(self) -> tuple[str, ...]:
        """The sdkit device kinds it runs on (``cpu``, ``cuda``, ``vulkan``...)."""
        return tuple(dict.fromkeys(GGML_KINDS.get(name, name.lower()) for name in self.backends))

    @property
    def gpu_kind(self) -> str | None:
        """The GPU API stable-diffusion.cpp runs on (its first non-CPU ggml backend), if any."""
        return next((kind for kind in self.kinds if kind != "cpu"), None)


def _library(module: ModuleType) -> ctypes.CDLL:
    lib = getattr(module, "_lib", None)
    if isinstance(lib, ctypes.CDLL):
        return lib
    folder = Path(module.__file__ or "").parent / "lib"
    found = sorted(folder.glob("*stable-diffusion*"))
    if not found:
        raise BackendUnavailableError(ENGINE, f"no stable-diffusion library in {folder}", install_hint())
    return ctypes.CDLL(str(found[0]))


def build_backends(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The ggml backends registered in ``lib`` (``("CPU",)`` for a CPU build)."""
    try:
        count, get, name = lib.ggml_backend_reg_count, lib.ggml_backend_reg_get, lib.ggml_backend_reg_name
    except AttributeError:  # a build that does not export ggml: its system info is all there is
        return ("CPU",)
    count.restype, count.argtypes = ctypes.c_size_t, []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    return tuple(name(get(i)).decode(errors="replace") for i in range(count()))


@cache
def build_info() -> BuildInfo:
    """The loaded build (the binding imported; a ``BackendUnavailableError`` if it cannot be)."""
    module = import_binding()
    lib = _library(module)
    version = str(installed_version() or getattr(module, "__version__", "?"))
    sdcpp = f"{module.sd_version().decode()} ({module.sd_commit().decode()})"
    info = module.sd_get_system_info().decode(errors="replace").strip()
    return BuildInfo(version, sdcpp, build_backends(lib), info)


def devices() -> list[Device]:
    """The devices this build runs on: ``cpu`` and, for a GPU build, the GPU API's first device
    (stable-diffusion.cpp runs a whole model on one device; Vulkan's can be chosen by index)."""
    info = build_info()
    gpu = info.gpu_kind
    return [Device("cpu")] if gpu is None else [Device(gpu, 0)]


def check_device(device: str | Device | None) -> dict[str, str]:
    """The environment a generation on ``device`` needs (``SD_VK_DEVICE`` for ``vulkan:N``), or a
    ``BackendUnavailableError`` when this build cannot run there (it names the build's devices and
    the CMake flag that would)."""
    info = build_info()
    if device is None:
        return {}
    wanted = Device.parse(device)
    gpu = info.gpu_kind
    if wanted.kind == "cpu" and gpu is None:
        return {}
    if wanted.kind == "cpu":
        reason = f"this {DISTRIBUTION} was built for {gpu} and runs the model there, not on the CPU"
        raise BackendUnavailableError(ENGINE, reason, install_hint("cpu") + " for a CPU build")
    if wanted.kind != gpu:
        built = ", ".join(info.backends)
        reason = f"this {DISTRIBUTION} {info.version} was built without {wanted.kind} (its ggml backends: {built})"
        raise BackendUnavailableError(ENGINE, reason, install_hint(wanted.kind))
    if wanted.kind == "vulkan":
        return {"SD_VK_DEVICE": str(wanted.index or 0)}
    if wanted.index:
        raise BackendUnavailableError(
            ENGINE, f"stable-diffusion.cpp runs on the first {wanted.kind} device only, not {wanted}", ""
        )
    return {}


def environment(variables: dict[str, str]) -> dict[str, str | None]:
    """Set ``variables``; returns the previous values, for ``restore``."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    return previous


def restore(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
