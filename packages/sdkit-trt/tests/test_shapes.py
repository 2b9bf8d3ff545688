"""The ``profiles`` option: validated against the graph's inputs before anything is built."""

from __future__ import annotations

import numpy as np
import pytest

from sdkit.backend import TensorInfo
from sdkit.errors import InputError, OptionError
from sdkit.options import make_options
from sdkit_trt.backend import TensorRTBackend
from sdkit_trt.shapes import Profile, check_in_profiles, is_static, parse_profiles, signature

F32 = np.dtype(np.float32)
LATENT = TensorInfo("latent", F32, ("batch", 4, "h", "w"))
TEXT = TensorInfo("text", F32, ("batch", 77, 768))
RANGE = ((1, 4, 32, 32), (1, 4, 64, 64), (1, 4, 128, 128))


def test_valid_profile() -> None:
    profiles = parse_profiles({"latent": RANGE}, [LATENT])
    assert profiles == {"latent": Profile(*RANGE)}
    assert profiles["latent"].contains((1, 4, 48, 96))
    assert not profiles["latent"].contains((1, 4, 16, 64))


def test_profiles_is_a_declared_extra_option() -> None:
    options = make_options({"profiles": {"latent": RANGE}}, TensorRTBackend.extra_options)
    assert options.extra["profiles"] == {"latent": RANGE}
    with pytest.raises(OptionError, match="profiles"):
        make_options({"profiles": [RANGE]}, TensorRTBackend.extra_options)
    with pytest.raises(OptionError, match="did you mean 'profiles'"):
        make_options({"profile": {}}, TensorRTBackend.extra_options)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"image": RANGE}, "not an input of the model"),
        ({"latent": RANGE[:2]}, "must be (min_shape, opt_shape, max_shape)"),
        ({"latent": ((1, 4, 32), (1, 4, 64), (1, 4, 128))}, "rank 4"),
        ({"latent": ((1, 4, 64, 64), (1, 4, 32, 32), (1, 4, 128, 128))}, "min <= opt <= max"),
        ({"latent": ((1, 3, 32, 32), (1, 4, 64, 64), (1, 4, 128, 128))}, "fixed to 4 by the model"),
        ({"latent": ((1, 4, 0, 32), (1, 4, 64, 64), (1, 4, 128, 128))}, "below 1"),
        ({"latent": ((1, 4, 32.0, 32), (1, 4, 64, 64), (1, 4, 128, 128))}, "tuple of integers"),
    ],
)
def test_invalid_profiles(raw: dict[str, object], words: str) -> None:
    with pytest.raises(OptionError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_profiles(raw, [LATENT])


def test_shared_symbol_needs_the_same_range_and_every_dynamic_input_a_profile() -> None:
    text = ((1, 77, 768), (2, 77, 768), (2, 77, 768))
    with pytest.raises(OptionError, match="'batch' is"):
        parse_profiles({"latent": RANGE, "text": text}, [LATENT, TEXT])
    with pytest.raises(OptionError, match="'text' has dynamic dims"):
        parse_profiles({"latent": RANGE}, [LATENT, TEXT])
    same = ((1, 77, 768), (1, 77, 768), (1, 77, 768))
    assert set(parse_profiles({"latent": RANGE, "text": same}, [LATENT, TEXT])) == {"latent", "text"}


def test_calls_outside_the_profile_are_input_errors() -> None:
    profiles = parse_profiles({"latent": RANGE}, [LATENT])
    check_in_profiles(profiles, {"latent": np.zeros((1, 4, 64, 32), np.float32)})
    with pytest.raises(InputError, match=r"outside the compiled profile \[1, 4, 32, 32\]..\[1, 4, 128, 128\]"):
        check_in_profiles(profiles, {"latent": np.zeros((1, 4, 256, 32), np.float32)})


def test_signatures_and_static_graphs() -> None:
    a = signature({"b": np.zeros((1, 2)), "a": np.zeros(3)})
    assert a == (("a", (3,)), ("b", (1, 2)))
    assert not is_static([LATENT])
    assert is_static([TensorInfo("x", F32, (1, 4, 8, 8))])
