"""Option validation: precision, compute units, target, flexible shapes."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.backend import TensorInfo
from sdkit.device import Device
from sdkit.errors import OptionError
from sdkit.options import make_options
from sdkit_coreml.backend import CoremlBackend
from sdkit_coreml.settings import settings_for

LATENT = [TensorInfo("latent", np.dtype(np.float32), ("batch", 32, "height", "width"))]


def settings(device: str = "ane", inputs: list[TensorInfo] = LATENT, **raw: object):  # type: ignore[no-untyped-def]
    return settings_for(make_options(raw, CoremlBackend.extra_options), Device.parse(device), inputs)


def test_defaults_follow_the_device() -> None:
    assert settings("ane").compute_units == "CPU_AND_NE"
    assert settings("gpu:0").compute_units == "CPU_AND_GPU"
    assert settings("cpu").compute_units == "CPU_ONLY"
    chosen = settings("cpu", compute_units="ALL", precision="fp16", target="macOS15")
    assert (chosen.compute_units, chosen.precision, chosen.target.name, chosen.target.sdpa) == (
        "ALL",
        "fp16",
        "macOS15",
        True,
    )


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"precision": "bf16"}, "fp32 or fp16"),
        ({"compute_units": "NPU"}, "compute_units must be one of ALL, CPU_AND_NE"),
        ({"target": "macOS12"}, "target must be one of macOS13"),
        ({"compute_units": 3}, "wrong type"),
        ({"shape_ranges": {"image": ((1, 3, 8, 8), (1, 3, 9, 9))}}, "'image' is not an input"),
        ({"shape_ranges": {"latent": ((1, 32, 8, 8),)}}, "(min_shape, max_shape)"),
        ({"shape_ranges": {"latent": ((1, 32, 64, 8), (1, 32, 32, 32))}}, "exceeds max"),
        ({"shape_ranges": {"latent": ((1, 4, 8, 8), (1, 4, 32, 32))}}, "axis 1 is fixed to 32"),
        ({"enumerated_shapes": {"latent": []}}, "non-empty list"),
        ({"enumerated_shapes": {"latent": [(1, 32, 8)]}}, "rank"),
        ({"enumerated_shapes": {"latent": [(1, 32, 0, 8)]}}, "below 1"),
        (
            {"enumerated_shapes": {"latent": [(1, 32, 8, 8)]}, "shape_ranges": {"latent": ((1, 32, 8, 8),) * 2}},
            "both",
        ),
    ],
)
def test_bad_options_are_named(raw: dict[str, object], words: str) -> None:
    with pytest.raises(OptionError) as error:
        settings(**raw)
    assert words in str(error.value)


def test_every_symbolic_input_needs_a_flexible_shape() -> None:
    inputs = [*LATENT, TensorInfo("cond", np.dtype(np.float32), ("batch", 8))]
    with pytest.raises(OptionError, match="cond"):
        settings(inputs=inputs, shape_ranges={"latent": ((1, 32, 8, 8), (1, 32, 64, 64))})


def test_flexible_shapes_accept_and_key() -> None:
    ranged = settings(shape_ranges={"latent": ((1, 32, 8, 8), (1, 32, 64, 64))}).flexible["latent"]
    assert ranged.accepts((1, 32, 16, 40)) and not ranged.accepts((1, 32, 65, 8))
    listed = settings(enumerated_shapes={"latent": [(1, 32, 8, 8), (1, 32, 16, 16)]}).flexible["latent"]
    assert listed.accepts((1, 32, 16, 16)) and not listed.accepts((1, 32, 12, 12))
    assert listed.key() == {"enumerated": [[1, 32, 8, 8], [1, 32, 16, 16]]}
    a = settings(compute_units="ALL").key()
    b = settings(compute_units="CPU_ONLY").key()
    assert a == b  # one package for every compute unit
    assert settings(precision="fp16").key() != a
