"""Which TensorRT flavour is installed, which GPUs it can build for, and importing it.

Two flavours share one Python API shape: TensorRT-RTX (module ``tensorrt_rtx``, the JIT
runtime for RTX GPUs; preferred) and TensorRT 10.x/11.x (module ``tensorrt``). Discovery
uses ``importlib.util.find_spec`` and distribution metadata, so nothing is imported until a
model is compiled. TensorRT-RTX builds only for the architectures its ``ComputeCapability``
enum names (Turing, Ampere, Ada, Blackwell RTX and GB10 in 1.7: SM 7.5/8.0/8.6/8.9/12.0/12.1,
no Hopper or datacenter Blackwell), so a device is given to TensorRT-RTX when it supports it
and to TensorRT otherwise.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from sdkit.errors import BackendUnavailableError
from sdkit.known_backends import install_command
from sdkit_trt.driver import Gpu

RTX_MODULE = "tensorrt_rtx"
TRT_MODULE = "tensorrt"
BACKEND_NAME = "tensorrt"
INSTALL_HINT = install_command("nvidia")

# TensorRT-RTX 1.x ComputeCapability members (SM75..SM121); refreshed from the enum once imported.
RTX_KNOWN_SMS = frozenset({75, 80, 86, 89, 120, 121})
# TensorRT 10/11 support Turing and newer; older GPUs are refused up front with a clear reason.
TRT_MIN_SM = 75
TRT_MIN_MAJOR = 10
# TensorRT 11.3.0 release notes, known issue: REFIT engines may drop a GEMM bias (fixed in 11.4).
TRT_BROKEN_REFIT = ("11.3.",)


@dataclass(frozen=True)
class RuntimeInfo:
    """An installed TensorRT flavour (not imported yet)."""

    module: str
    version: str  # from distribution metadata; "" when unknown

    @property
    def is_rtx(self) -> bool:
        return self.module == RTX_MODULE

    @property
    def label(self) -> str:
        name = "TensorRT-RTX" if self.is_rtx else "TensorRT"
        return f"{name} {self.version}".strip()

    @property
    def major(self) -> int | None:
        match = re.match(r"(\d+)", self.version)
        return int(match.group(1)) if match else None

    def supported_sms(self) -> frozenset[int] | None:
        """The SM numbers this flavour builds for, or None for "SM >= TRT_MIN_SM"."""
        return RTX_KNOWN_SMS if self.is_rtx else None

    def why_not(self, gpu: Gpu) -> str:
        """Empty when this flavour can build for ``gpu``, else the reason."""
        sms = self.supported_sms()
        major, minor = gpu.compute_capability
        if sms is not None and gpu.sm not in sms:
            listed = ", ".join(f"{s // 10}.{s % 10}" for s in sorted(sms))
            return f"{self.label} builds for compute capability {listed}, not {major}.{minor}"
        if sms is None and gpu.sm < TRT_MIN_SM:
            return f"{self.label} needs compute capability 7.5 (Turing) or newer, not {major}.{minor}"
        return ""


def module_available(name: str) -> bool:
    """Whether ``import name`` would find a module (nothing is imported). Tests replace this."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def distribution_version(module: str) -> str:
    """The version of the distribution that provides ``module`` (e.g. tensorrt_rtx_cu13)."""
    try:
        providers = importlib.metadata.packages_distributions().get(module, [])
    except Exception:  # broken metadata of an unrelated distribution
        providers = []
    for dist in [*providers, module, module.replace("_", "-")]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def find_runtimes() -> tuple[list[RuntimeInfo], list[str]]:
    """Installed flavours, preferred first, and notes on installed-but-unusable ones."""
    found: list[RuntimeInfo] = []
    notes: list[str] = []
    if module_available(RTX_MODULE):
        found.append(RuntimeInfo(RTX_MODULE, distribution_version(RTX_MODULE)))
    if module_available(TRT_MODULE):
        info = RuntimeInfo(TRT_MODULE, distribution_version(TRT_MODULE))
        if info.major is not None and info.major < TRT_MIN_MAJOR:
            notes.append(f"{info.label} is too old (sdkit needs TensorRT 10 or newer, or TensorRT-RTX)")
        elif info.version.startswith(TRT_BROKEN_REFIT):
            notes.append(f"{info.label} has a known refit bug (GEMM biases dropped); use TensorRT 11.4 or newer")
        else:
            found.append(info)
    return found, notes


def rtx_unsupported(gpus: Sequence[Gpu]) -> str:
    """With no TensorRT installed: the GPUs TensorRT-RTX (the ``[nvidia]`` extra) cannot build
    for, by name and compute capability ("" when it supports them all, or there is none)."""
    rtx = RuntimeInfo(RTX_MODULE, "")
    refused = [f"cuda:{gpu.ordinal} {gpu.describe()}" for gpu in gpus if rtx.why_not(gpu)]
    if not refused:
        return ""
    listed = ", ".join(f"{s // 10}.{s % 10}" for s in sorted(RTX_KNOWN_SMS))
    gpus_named = "; ".join(refused)
    return f"TensorRT-RTX (the [nvidia] extra) does not support {gpus_named}: it builds for compute capability {listed}"


def cuda_bindings_available() -> bool:
    return module_available("cuda.bindings") or module_available("cuda.cudart")


def runtime_for(gpu: Gpu, runtimes: list[RuntimeInfo]) -> tuple[RuntimeInfo | None, str]:
    """The preferred flavour that builds for ``gpu``, or (None, every flavour's reason)."""
    reasons = []
    for runtime in runtimes:
        why = runtime.why_not(gpu)
        if not why:
            return runtime, ""
        reasons.append(why)
    return None, "; ".join(reasons)


def import_runtime(info: RuntimeInfo) -> ModuleType:
    """Import the flavour's module; a broken install is a BackendUnavailableError."""
    try:
        return importlib.import_module(info.module)
    except (ImportError, OSError) as exc:
        raise BackendUnavailableError(
            BACKEND_NAME, f"{info.module} is installed but cannot be imported: {exc}", INSTALL_HINT
        ) from None


def sms_from_module(trt: ModuleType) -> frozenset[int]:
    """SM numbers of a TensorRT-RTX module's ``ComputeCapability`` enum (SM75 -> 75)."""
    members = getattr(getattr(trt, "ComputeCapability", None), "__members__", {})
    return frozenset(int(name[2:]) for name in members if re.fullmatch(r"SM\d+", name))
