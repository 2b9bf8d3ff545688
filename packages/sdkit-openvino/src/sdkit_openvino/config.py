"""sdkit Options -> OpenVINO compile properties, and the precision the device really runs.

fp32 is always requested explicitly: OpenVINO's CPU plugin defaults to bf16 on CPUs with
AMX / AVX512-BF16 (and the GPU plugin to f16), which would make "fp32" silently inexact.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdkit.cache import cache_root, key_digest, make_key
from sdkit.options import Options, physical_cores
from sdkit_openvino.runtime import BACKEND_NAME, OvDevice

# sdkit precision -> (INFERENCE_PRECISION_HINT value, OPTIMIZATION_CAPABILITIES entry)
PRECISIONS: dict[str, tuple[str, str]] = {"fp32": ("f32", "FP32"), "fp16": ("f16", "FP16"), "bf16": ("bf16", "BF16")}
# What OpenVINO reports back for the hint, normalised to sdkit's names.
_OV_TO_SDKIT = {"f32": "fp32", "float32": "fp32", "f16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


class PrecisionFallbackWarning(UserWarning):
    """The device runs a lower-precision request in f32 (or another precision)."""


def cache_dir(key: Mapping[str, Any]) -> Path:
    """OpenVINO's model cache for one sdkit key: ``<sdkit cache>/openvino/<digest>``."""
    return cache_root() / BACKEND_NAME / key_digest(key)


def cache_key(
    graph_hash: str, version: str, device: OvDevice, options: Options, shapes: Mapping[str, Sequence[int]]
) -> dict[str, Any]:
    """sdkit's key for the OpenVINO cache folder: graph, OpenVINO version, device, options, input
    shapes. Weights are not in it: OpenVINO's own blob hash covers the constants' contents, so
    different weights get different blobs inside the same folder."""
    return make_key(
        graph_hash=graph_hash,
        backend=BACKEND_NAME,
        backend_version=version,
        device=device.vendor_name,
        options=options.key(),
        input_shapes=shapes,
    )


def compile_properties(
    device: OvDevice, options: Options, supported: Sequence[str], cache: Path | None
) -> dict[str, Any]:
    """The property map for ``Core.compile_model`` (only keys the device accepts)."""
    props: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[options.precision][0],
        "PERFORMANCE_HINT": "LATENCY",
    }
    if device.device.kind == "cpu":
        props["INFERENCE_NUM_THREADS"] = options.threads or physical_cores()
    if cache is not None:
        props["CACHE_DIR"] = str(cache)
    return {k: v for k, v in props.items() if k in supported or k == "CACHE_DIR"}


def effective_precision(requested: str, capabilities: frozenset[str], reported: str | None) -> tuple[str, str]:
    """(precision the device runs, note). ``reported`` is the compiled model's
    INFERENCE_PRECISION_HINT, which need not be the one asked for (OpenVINO's CPU plugin answers
    an f16 hint with bf16 on a CPU that has AVX-512 BF16 but no AVX-512 FP16); a precision the
    device has no capability for runs in f32 whatever it says."""
    ran = _OV_TO_SDKIT.get((reported or "").lower(), requested)  # unknown answer: trust the hint
    if ran != "fp32" and PRECISIONS[ran][1] not in capabilities:
        ran = "fp32"
    if ran == requested:
        return ran, ""
    return (
        ran,
        f"{requested} was requested but the device runs {ran} "
        f"(its capabilities: {', '.join(sorted(capabilities)) or 'none'})",
    )


def warn_precision(note: str) -> None:
    if note:
        warnings.warn(f"openvino: {note}", PrecisionFallbackWarning, stacklevel=4)
