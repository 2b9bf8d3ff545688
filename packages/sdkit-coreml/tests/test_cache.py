"""The .mlpackage in sdkit's artifact cache: key fields, hits, weight swaps (re-conversion)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from coreml_helpers import needs_coremltools

from sdkit.cache import ArtifactCache, key_digest
from sdkit.device import Device
from sdkit.model import load_onnx
from sdkit.options import make_options
from sdkit_coreml.backend import CoremlBackend
from sdkit_coreml.package import cache_key, cached_package, describe
from sdkit_coreml.settings import settings_for

SHAPES = {"latent": (1, 32, 16, 16)}


def _setup(taef2: Path, **raw: object):  # type: ignore[no-untyped-def]
    model = load_onnx(taef2 / "taef2_decoder.onnx")
    graph = model.graph.with_input_shapes(SHAPES)
    settings = settings_for(make_options(raw, CoremlBackend.extra_options), Device("ane"), graph.inputs)
    return model, graph, settings


def test_key_covers_weights_settings_shapes_not_compute_units(taef2: Path) -> None:
    model, graph, settings = _setup(taef2)
    base = key_digest(cache_key(graph, model.weights, settings, SHAPES))
    other_weights = model.weights.updated({"1.weight": np.zeros_like(model.weights["1.weight"])})
    variants = [
        key_digest(cache_key(graph, other_weights, settings, SHAPES)),
        key_digest(cache_key(graph, model.weights, _setup(taef2, precision="fp16")[2], SHAPES)),
        key_digest(cache_key(graph, model.weights, _setup(taef2, target="macOS15")[2], SHAPES)),
        key_digest(cache_key(graph, model.weights, settings, {"latent": (1, 32, 32, 32)})),
    ]
    assert base not in variants and len(set(variants)) == len(variants)
    assert key_digest(cache_key(graph, model.weights, _setup(taef2, compute_units="CPU_ONLY")[2], SHAPES)) == base
    key = cache_key(graph, model.weights, settings, SHAPES)
    assert key["backend"] == "coreml" and key["backend_version"].startswith("coremltools-")
    assert key["weights"] == model.weights.hash()


def test_convert_once_then_hit_then_swap_weights(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    model, graph, settings = _setup(taef2)
    cache = ArtifactCache(tmp_path)
    first = cached_package(graph, model.weights, settings, SHAPES, cache, tmp_path / "scratch")
    assert not first.cached and first.seconds > 0
    assert first.path.parent.parent.name == "coreml"  # <cache>/artifacts/coreml/<digest>/model.mlpackage
    start = time.perf_counter()
    again = cached_package(graph, model.weights, settings, SHAPES, cache, tmp_path / "scratch")
    hit_seconds = time.perf_counter() - start
    assert again.cached and again.path == first.path
    assert again.names.inputs == {"latent": "latent"} and again.names.outputs == {"image": "image"}
    swapped = model.weights.updated({"1.weight": model.weights["1.weight"] * 0.5})
    refit = cached_package(graph, swapped, settings, SHAPES, cache, tmp_path / "scratch")
    assert not refit.cached and refit.path != first.path
    print(f"TAEF2 decoder 16x16: convert {first.seconds:.2f} s, cache hit {hit_seconds:.2f} s, ")
    print(f"weight swap (re-conversion) {refit.seconds:.2f} s")
    assert describe(refit.path)["ops"] == describe(first.path)["ops"]


def test_damaged_entry_is_rebuilt(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    model, graph, settings = _setup(taef2)
    cache = ArtifactCache(tmp_path)
    first = cached_package(graph, model.weights, settings, SHAPES, cache, tmp_path / "scratch")
    weights_file = next(first.path.rglob("*.bin"))
    weights_file.write_bytes(b"truncated")
    again = cached_package(graph, model.weights, settings, SHAPES, cache, tmp_path / "scratch")
    assert not again.cached
    assert next(again.path.rglob("*.bin")).stat().st_size > 1000


def test_without_cache_converts_into_scratch(taef2: Path, tmp_path: Path) -> None:
    needs_coremltools()
    model, graph, settings = _setup(taef2)
    package = cached_package(graph, model.weights, settings, SHAPES, None, tmp_path / "scratch")
    assert package.path.parent == tmp_path / "scratch" and not package.cached
