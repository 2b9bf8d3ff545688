"""``Device``: one value type for every backend's devices, written ``kind:index``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sdkit.errors import DeviceError

# Vendor spellings -> sdkit kinds. Keys are lower-cased vendor prefixes.
VENDOR_KINDS: dict[str, str] = {
    "cpu": "cpu",
    "cuda": "cuda",  # ggml "CUDA0", TensorRT / CUDA ordinals
    "gpu": "gpu",  # OpenVINO "GPU.0" (Intel iGPU / dGPU)
    "npu": "npu",  # OpenVINO "NPU"
    "vulkan": "vulkan",  # ggml "Vulkan0"
    "metal": "metal",  # ggml "Metal"
    "mtl": "metal",  # ggml "MTL0" on newer builds
    "rocm": "rocm",  # MIGraphX / HIP ordinals
    "hip": "rocm",  # ggml "ROCm0"/"HIP0"
    "sycl": "sycl",
    "ane": "ane",  # Core ML Neural Engine
    "blas": "cpu",
}

_DEVICE_RE = re.compile(r"^([a-z][a-z_]*)(?::(\d+))?$")
_VENDOR_RE = re.compile(r"^([A-Za-z_]+?)[._:]?(\d+)?$")


@dataclass(frozen=True, order=True)
class Device:
    """A device: ``kind`` (``cpu``, ``cuda``, ``vulkan``, ``gpu``...) and an optional index."""

    kind: str
    index: int | None = None
    description: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str | Device) -> Device:
        """``"cuda:0"`` -> ``Device("cuda", 0)``; vendor spellings (``GPU.0``, ``CUDA0``) too."""
        if isinstance(text, Device):
            return text
        if not isinstance(text, str):
            raise DeviceError(f"a device is written as a string such as 'cpu' or 'cuda:0', not {text!r}")
        raw = text.strip()
        match = _DEVICE_RE.match(raw.lower())
        if match:
            index = int(match.group(2)) if match.group(2) is not None else None
            return cls(match.group(1), index)
        return cls.from_vendor(raw)

    @classmethod
    def from_vendor(cls, name: str, description: str = "") -> Device:
        """Map a vendor's device name (``GPU.1``, ``Vulkan0``, ``CUDA0``) to a Device."""
        match = _VENDOR_RE.match(name.strip())
        if not match:
            raise DeviceError(f"cannot parse device {name!r}: expected kind or kind:index, e.g. cpu, cuda:0")
        kind = VENDOR_KINDS.get(match.group(1).lower(), match.group(1).lower())
        index = int(match.group(2)) if match.group(2) is not None else None
        return cls(kind, index, description)

    def matches(self, other: Device) -> bool:
        """Same kind, and same index where both name one (``cuda`` matches ``cuda:0``)."""
        if self.kind != other.kind:
            return False
        return self.index is None or other.index is None or self.index == other.index

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


CPU = Device("cpu")
