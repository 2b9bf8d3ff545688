"""Which lowering each 2-D convolution shape gets: F32 im2col + mul_mat (``im2col``, exact,
chunked for big maps) or ggml's GGML_OP_CONV_2D (``direct``: the same F32 products, im2col'd a
16 MB tile at a time into the work buffer, so no full im2col tensor exists).

``SDKIT_GGML_CONV`` or the ``conv`` option: ``im2col`` (default), ``direct``, or ``auto``, which
times both on the device at compile time, per distinct shape, and keeps the faster (the timing
is stored in sdkit's artifact cache, so a second compile on the same machine times nothing).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from sdkit.errors import OptionError
from sdkit_ggml.runtime import lib as L

ENV = "SDKIT_GGML_CONV"
MODES = ("im2col", "direct", "auto")
DEFAULT_MODE = "im2col"
# GGML_OP_CONV_2D's CPU work buffer (GGML_IM2COL_WORK_SIZE in ggml-cpu): a tile must hold at
# least one patch row (C*KH*KW kernel-typed values) and its C_out F32 results, or ggml aborts
DIRECT_WORK_BYTES = 16 << 20
WIN_MARGIN = 0.95  # direct is taken when its median is under 95% of im2col's


def conv_mode(option: object | None) -> str:
    """The strategy asked for: the ``conv`` option, else $SDKIT_GGML_CONV, else the default."""
    mode = option if option is not None else (os.environ.get(ENV) or DEFAULT_MODE)
    if mode not in MODES:
        raise OptionError(f"conv strategy must be one of {', '.join(MODES)}, not {mode!r} (option conv / {ENV})")
    return str(mode)


@dataclass(frozen=True)
class ConvShape:
    """One conv as lowered (one group, symmetric pads): input [N,C,H,W], kernel [OC,C,KH,KW]."""

    input: tuple[int, int, int, int]
    kernel: tuple[int, int, int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    kernel_type: int

    @property
    def out_hw(self) -> tuple[int, int]:
        _, _, h, w = self.input
        _, _, kh, kw = self.kernel
        oh = (h + 2 * self.pad[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        ow = (w + 2 * self.pad[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        return oh, ow

    @property
    def macs(self) -> int:
        oc, c, kh, kw = self.kernel
        oh, ow = self.out_hw
        return self.input[0] * oc * oh * ow * c * kh * kw

    def direct_fits(self) -> bool:
        """Whether GGML_OP_CONV_2D's CPU kernel can take this shape (else it would abort)."""
        oc, c, kh, kw = self.kernel
        size = 2 if self.kernel_type == L.GGML_TYPE_F16 else 4
        return (c * kh * kw * size + oc * 4) * 8 <= DIRECT_WORK_BYTES

    def describe(self) -> str:
        n, c, h, w = self.input
        oc, _, kh, kw = self.kernel
        kind = "f16" if self.kernel_type == L.GGML_TYPE_F16 else "f32"
        return (
            f"{n}x{c}x{h}x{w} k{oc}x{kh}x{kw} s{self.stride[0]},{self.stride[1]} "
            f"p{self.pad[0]},{self.pad[1]} d{self.dilation[0]},{self.dilation[1]} {kind}"
        )


# a shape's measured seconds per strategy (None: not measured), from ``Tuner``
Timer = Callable[[ConvShape], dict[str, float] | None]


@dataclass
class ConvChooser:
    """Picks a strategy per shape for one compiled model and records what it picked
    (``choices``: shape description -> strategy; ``timings``: the measurements behind them)."""

    mode: str
    direct_available: bool
    timer: Timer | None = None
    choices: dict[str, str] = field(default_factory=dict)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)

    def __call__(self, shape: ConvShape) -> str:
        name = shape.describe()
        if name not in self.choices:
            self.choices[name] = self._pick(shape, name)
        return self.choices[name]

    def _pick(self, shape: ConvShape, name: str) -> str:
        if not self.direct_available or not shape.direct_fits() or self.mode == "im2col":
            return "im2col"
        if self.mode == "direct":
            return "direct"
        times = self.timer(shape) if self.timer is not None else None
        if not times:
            return "im2col"
        self.timings[name] = times
        # im2col (the default, chunked to bound memory) unless direct is clearly faster: a
        # timing on a busy machine is noisy
        direct = times.get("direct")
        return "direct" if direct is not None and direct < WIN_MARGIN * times["im2col"] else "im2col"
