"""Device, Options and feed validation."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.backend import TensorInfo, check_feeds
from sdkit.device import Device
from sdkit.errors import DeviceError, InputError, OptionError
from sdkit.options import Options, make_options, physical_cores


@pytest.mark.parametrize(
    ("text", "kind", "index"),
    [
        ("cpu", "cpu", None),
        ("cuda:0", "cuda", 0),
        ("Vulkan1", "vulkan", 1),
        ("GPU.1", "gpu", 1),
        ("CUDA0", "cuda", 0),
        ("NPU", "npu", None),
        ("MTL0", "metal", 0),
    ],
)
def test_device_spellings(text: str, kind: str, index: int | None) -> None:
    device = Device.parse(text)
    assert (device.kind, device.index) == (kind, index)
    assert Device.parse(str(device)) == device


def test_device_matching_and_errors() -> None:
    assert Device.parse("cuda").matches(Device("cuda", 1))
    assert not Device.parse("cuda:0").matches(Device("cuda", 1))
    assert Device("cpu", description="x") == Device("cpu")
    with pytest.raises(DeviceError):
        Device.parse("!!")
    with pytest.raises(DeviceError, match="string"):
        Device.parse(0)  # type: ignore[arg-type]


def test_options_are_validated() -> None:
    assert make_options({}) == Options()
    opts = make_options({"precision": "fp16", "threads": 2, "tile": 4}, {"tile": int})
    assert opts.precision == "fp16" and opts.threads == 2 and opts.extra == {"tile": 4}
    with pytest.raises(OptionError, match="did you mean 'threads'"):
        make_options({"thread": 2})
    with pytest.raises(OptionError, match="precision"):
        make_options({"precision": "int4"})
    with pytest.raises(OptionError, match="threads"):
        make_options({"threads": 0})
    with pytest.raises(OptionError, match="wrong type"):
        make_options({"tile": "big"}, {"tile": int})
    assert physical_cores() >= 1


INPUTS = [TensorInfo("a", np.dtype(np.float32), ("n", 3)), TensorInfo("b", np.dtype(np.int64), ("n",))]


def test_feeds_are_checked_with_clear_messages() -> None:
    good = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.int64)}
    assert set(check_feeds(INPUTS, good)) == {"a", "b"}
    cases = [
        ({**good, "c": good["b"]}, "unknown input 'c'"),
        ({"a": good["a"]}, "missing input 'b'"),
        ({**good, "a": np.zeros((2, 3), np.float64)}, "dtype float64"),
        ({**good, "a": np.zeros((2, 3, 1), np.float32)}, "rank 2"),
        ({**good, "a": np.zeros((2, 4), np.float32)}, "axis 1"),
        ({**good, "b": np.zeros(3, np.int64)}, "dimension 'n'"),
    ]
    for feeds, message in cases:
        with pytest.raises(InputError, match=message):
            check_feeds(INPUTS, feeds)


def test_scalars_stay_scalars() -> None:
    info = [TensorInfo("s", np.dtype(np.int64), ())]
    assert check_feeds(info, {"s": np.array(3)})["s"].ndim == 0


def test_shared_value_types_keep_their_public_names() -> None:
    import sdkit
    import sdkit.backend
    import sdkit.types

    assert sdkit.TensorInfo is sdkit.backend.TensorInfo is sdkit.types.TensorInfo
    assert sdkit.backend.Dim is sdkit.types.Dim
