"""Engine cache keys and side-cache paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from trt_helpers import small_model

from sdkit.cache import key_digest
from sdkit.model import Model
from sdkit_trt.driver import Gpu
from sdkit_trt.runtime import RuntimeInfo
from sdkit_trt.shapes import Profile
from sdkit_trt.store import engine_key, read_bytes, side_cache_path, write_atomic

RTX = RuntimeInfo("tensorrt_rtx", "1.7.1.116")
GPU = Gpu(0, "NVIDIA GeForce RTX 3060", (8, 6), 12 * 2**30)


def key(model: Model, **changes: object) -> str:
    args: dict[str, object] = {
        "graph_hash": model.graph.hash,
        "runtime": RTX,
        "gpu": GPU,
        "precision": "fp16",
        "input_shapes": {"x": (1, 3, 4, 4)},
        "profiles": {},
    }
    args.update(changes)
    return key_digest(engine_key(**args))  # type: ignore[arg-type]


def test_same_graph_other_weights_same_key() -> None:
    model = small_model()
    other = model.with_weights({"w": np.full((2, 3, 1, 1), 7, np.float32)})
    assert other.weights.hash() != model.weights.hash()
    assert key(model) == key(other)
    assert (
        engine_key(graph_hash="g", runtime=RTX, gpu=GPU, precision="fp32", input_shapes=None, profiles={})["weights"]
        is None
    )


def test_shapes_options_device_and_runtime_change_the_key() -> None:
    model = small_model()
    base = key(model)
    variants = [
        key(model, input_shapes={"x": (2, 3, 4, 4)}),
        key(model, precision="fp32"),
        key(model, profiles={"x": Profile((1, 3, 4, 4), (1, 3, 8, 8), (1, 3, 16, 16))}),
        key(model, gpu=Gpu(0, "NVIDIA GeForce RTX 4090", (8, 9), 24 * 2**30)),
        key(model, runtime=RuntimeInfo("tensorrt_rtx", "1.6.1.120")),
        key(model, runtime=RuntimeInfo("tensorrt", "10.13.0.35")),
        key(model, graph_hash="another graph"),
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_same_gpu_model_on_another_ordinal_shares_engines() -> None:
    model = small_model()
    assert key(model) == key(model, gpu=Gpu(1, GPU.name, GPU.compute_capability, GPU.total_memory))


def test_side_caches_live_under_the_sdkit_cache(tmp_path: Path) -> None:
    path = side_cache_path("runtime", RTX, GPU, root=tmp_path)
    assert path.parent == tmp_path / "tensorrt"
    assert path.name == "runtime-tensorrt_rtx-1.7.1.116-sm86-nvidia-geforce-rtx-3060.bin"
    assert read_bytes(path) == b""
    write_atomic(path, b"kernels")
    assert read_bytes(path) == b"kernels"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
