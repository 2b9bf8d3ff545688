"""Refit weight sets: complete, exact names, shapes and dtypes; baked constants guarded."""

from __future__ import annotations

import numpy as np
import pytest
from trt_helpers import small_model

from sdkit.errors import InputError
from sdkit_trt.fp16 import convert_graph
from sdkit_trt.weights import baked_digests, changed_baked, expected_weights, refuse_baked_change, validate_weights


def test_expected_weights_come_from_the_stripped_graph() -> None:
    model = small_model()
    assert expected_weights(model.graph) == {
        "w": ((2, 3, 1, 1), np.dtype(np.float32)),
        "b": ((2,), np.dtype(np.float32)),
        "shape": ((2,), np.dtype(np.int64)),
    }
    assert set(validate_weights(model.graph, model.weights)) == {"w", "b", "shape"}


def test_missing_extra_misshaped_and_mistyped_weights_are_all_reported() -> None:
    model = small_model()
    weights = dict(model.weights)
    del weights["b"]
    weights["w"] = np.ones((2, 3, 3, 3), np.float32)
    weights["shape"] = np.array([1, -1], np.int32)
    weights["lora_up"] = np.ones(3, np.float32)
    with pytest.raises(InputError) as error:
        validate_weights(model.graph, weights)
    text = str(error.value)
    assert "1 weight(s) missing: 'b' (refit takes the complete set)" in text
    assert "1 weight(s) not in the model: 'lora_up'" in text
    assert "weight 'w' is float32[2, 3, 3, 3], the model expects float32[2, 3, 1, 1]" in text
    assert "weight 'shape' is int32[2], the model expects int64[2]" in text


def test_baked_weights_are_detected_and_refused() -> None:
    model = small_model()
    baked = baked_digests(model.weights, refittable=["w", "b"])
    assert set(baked) == {"shape"}
    changed = dict(model.weights)
    changed["w"] = np.full((2, 3, 1, 1), 2, np.float32)  # refittable: fine
    assert changed_baked(baked, changed) == []
    changed["shape"] = np.array([2, -1], np.int64)
    assert changed_baked(baked, changed) == ["shape"]
    with pytest.raises(InputError, match=r"refit cannot change 'shape'.*compile the model again"):
        refuse_baked_change(changed_baked(baked, changed))


def test_fp16_plan_maps_engine_weights_back_to_the_users_names() -> None:
    model = small_model()
    plan = convert_graph(model.graph)
    assert plan.fp16_weights == {"w": "w", "b": "b"}
    new = model.weights.updated({"w": np.full((2, 3, 1, 1), 0.1, np.float32)})
    engine_weights = plan.convert_weights(new)
    assert engine_weights["w"].dtype == np.float16
    assert engine_weights["w"][0, 0, 0, 0] == np.float16(0.1)
    assert engine_weights["shape"].dtype == np.int64
    # Refit from the full set each time: a second set replaces, never adds to, the first.
    again = plan.convert_weights(model.weights)
    assert float(again["w"][0, 0, 0, 0]) == 1.0
