"""sdkit Options -> MIGraphX compile choices, and the artifact-cache key of a compiled program.

- ``precision``: ``fp32`` compiles the parsed program as is; ``fp16`` runs
  ``migraphx.quantize_fp16`` on it first (weights and math in half precision, I/O stays fp32).
  MIGraphX has no bf16 quantization pass: ``bf16`` is refused.
- ``fast_math`` (extra, bool): MIGraphX's approximate kernels (fast erf/gelu and friends);
  default on for fp16, off for fp32 so that fp32 stays as exact as the ONNX graph.
- ``exhaustive_tune`` (extra, bool, default off): try every kernel configuration at compile.
- ``offload_copy`` is always on: sdkit feeds and reads numpy arrays in host memory.

A compiled ``.mxr`` holds the weights, so the key carries the weights hash; the device
identity is the GPU's gfx target (a program compiled on one gfx1100 serves another).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sdkit.cache import make_key
from sdkit.errors import OptionError
from sdkit.options import Options
from sdkit_migraphx.runtime import BACKEND_NAME

PRECISIONS = ("fp32", "fp16")  # fp16: quantize_fp16

EXTRA_OPTIONS: Mapping[str, type | tuple[type, ...]] = {"fast_math": bool, "exhaustive_tune": bool}


@dataclass(frozen=True)
class Settings:
    precision: str
    fast_math: bool
    exhaustive_tune: bool
    offload_copy: bool = True

    def key(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "fast_math": self.fast_math,
            "exhaustive_tune": self.exhaustive_tune,
            "offload_copy": self.offload_copy,
        }


def settings_for(options: Options) -> Settings:
    if options.precision not in PRECISIONS:
        raise OptionError(f"MIGraphX compiles fp32 or fp16 (quantize_fp16), not {options.precision}")
    fast_math = options.extra.get("fast_math", options.precision == "fp16")
    return Settings(options.precision, bool(fast_math), bool(options.extra.get("exhaustive_tune", False)))


def program_key(
    *,
    graph_hash: str,
    weights_hash: str,
    version: str,
    gfx: str,
    settings: Settings,
    input_shapes: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    return make_key(
        graph_hash=graph_hash,
        backend=BACKEND_NAME,
        backend_version=f"migraphx-{version}",
        device=gfx,
        options=settings.key(),
        input_shapes=input_shapes,
        weights_hash=weights_hash,
    )
