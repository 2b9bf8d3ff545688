"""Two lowering switches, each an option of the ggml backend or an environment variable (the
option wins), so every lowering can be measured on and off (``benchmarks/ggml_fp16.py``):

- ``flash_attn`` / ``SDKIT_GGML_FLASH_ATTN``: which attention patterns become one
  ``ggml_flash_attn_ext`` (``compiler/pass_fusions.py``, ``converters/fused.py``).
  ``"auto"`` (default): under ``precision="fp32"`` only diffusers' baddbmm pattern without a
  mask, as before this switch existed (fp32 results stay bit for bit what they were); under
  ``"fp16"`` and ``"q8_0"`` also an additive mask (CLIP's causal mask) and torch SDPA's export
  (Q and K^T each scaled by sqrt(scale)). ``"on"``: every pattern at every precision.
  ``"off"``: no attention fusion (MatMul, Softmax, MatMul as exported).
- ``f16_activations`` / ``SDKIT_GGML_F16_ACTIVATIONS``: under ``precision="fp16"`` / ``"q8_0"``,
  the runtime operand of a product of two activations (attention's Q K^T and P V, a MatMul or
  Einsum of two runtime tensors) and flash attention's K and V go to ggml as F16 (``"on"``) or
  stay F32 (``"off"``). ``"auto"`` (default): on for a GPU device (an F16 operand makes the
  product an F16 tensor-core GEMM there), off on the CPU (measured no faster there: the CPU
  converts the other operand to F16 inside the product anyway, and the cast costs a pass).
  Weights are F16 under those precisions either way; under ``"fp32"`` this switch changes
  nothing.
- ``matmul_prec`` / ``SDKIT_GGML_MATMUL_PREC``: ``"default"`` (ggml's choice) or ``"f32"``
  (``ggml_mul_mat_set_prec(GGML_PREC_F32)`` on every mul_mat). The CPU accumulates every
  product in F32 either way (no effect there); ggml-cuda 0.20.2 multiplies an F16 first operand
  with cuBLAS at ``CUBLAS_COMPUTE_16F`` (F16 accumulation) by default, and with ``"f32"``
  widens it to F32 (TF32 tensor cores, F32 accumulation): the accuracy side of fp16 on a GPU.
"""

from __future__ import annotations

import os

from sdkit.errors import OptionError

FLASH_ENV = "SDKIT_GGML_FLASH_ATTN"
FLASH_MODES = ("auto", "on", "off")
F16_ENV = "SDKIT_GGML_F16_ACTIVATIONS"
F16_MODES = ("auto", "on", "off")
HALF_PRECISIONS = ("fp16", "q8_0")
MATMUL_PREC_ENV = "SDKIT_GGML_MATMUL_PREC"
MATMUL_PREC_MODES = ("default", "f32")


def _mode(option: object | None, env: str, modes: tuple[str, ...], name: str) -> str:
    value = option if option is not None else os.environ.get(env, "").strip() or modes[0]
    mode = str(value).strip().lower()
    if mode not in modes:
        raise OptionError(f"{name} must be one of {', '.join(modes)}, not {value!r} (option {name} / {env})")
    return mode


def flash_attn_mode(option: object | None) -> str:
    """The ``flash_attn`` option, else $SDKIT_GGML_FLASH_ATTN, else ``"auto"``."""
    return _mode(option, FLASH_ENV, FLASH_MODES, "flash_attn")


def f16_activations_mode(option: object | None) -> str:
    """The ``f16_activations`` option, else $SDKIT_GGML_F16_ACTIVATIONS, else ``"auto"``."""
    return _mode(option, F16_ENV, F16_MODES, "f16_activations")


def matmul_prec_mode(option: object | None) -> str:
    """The ``matmul_prec`` option, else $SDKIT_GGML_MATMUL_PREC, else ``"default"``."""
    return _mode(option, MATMUL_PREC_ENV, MATMUL_PREC_MODES, "matmul_prec")


def attention_patterns(mode: str, precision: str) -> str:
    """What the attention pass fuses: ``"all"`` (masked and SDPA-scaled patterns too),
    ``"plain"`` (the unmasked baddbmm pattern only) or ``"none"``."""
    if mode == "off":
        return "none"
    if mode == "on" or precision in HALF_PRECISIONS:
        return "all"
    return "plain"


def f16_activations(mode: str, precision: str, device_kind: str) -> bool:
    """Whether the fp16 compute path casts activations to F16 (``device_kind``: sdkit's Device.kind)."""
    if precision not in HALF_PRECISIONS:
        return False
    return mode == "on" or (mode == "auto" and device_kind != "cpu")
