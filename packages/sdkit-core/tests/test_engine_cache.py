"""sdkit.engine_cache.EngineCache: one engine per signature, built once under concurrency, a
failed build stores nothing, rebuild swaps all at once (dropping engines built meanwhile from the
old weights), clear closes each, and it reads as a mapping."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sdkit.engine_cache import EngineCache


def test_built_once_per_signature_and_read_as_a_mapping() -> None:
    built: list[tuple[int, ...]] = []
    cache: EngineCache[tuple[int, ...], str] = EngineCache()

    def build(key: tuple[int, ...]) -> str:
        built.append(key)
        return f"engine{key}"

    assert cache == {}
    assert cache.get_or_build((1, 2), build) == "engine(1, 2)"
    assert cache.get_or_build((1, 2), build) == "engine(1, 2)"
    assert cache.get_or_build((3,), build) == "engine(3,)"
    assert built == [(1, 2), (3,)]
    assert cache == {(1, 2): "engine(1, 2)", (3,): "engine(3,)"}
    assert len(cache) == 2 and (3,) in cache and (4,) not in cache
    assert list(cache) == [(1, 2), (3,)]
    assert cache[(3,)] == "engine(3,)"
    with pytest.raises(KeyError):
        cache[(4,)]


def test_none_is_a_key() -> None:
    cache: EngineCache[tuple[int, ...] | None, int] = EngineCache()
    assert cache.get_or_build(None, lambda _: 7) == 7
    assert list(cache) == [None]


def test_concurrent_callers_of_a_new_signature_build_it_once() -> None:
    calls = 0
    started = threading.Event()
    release = threading.Event()

    def build(key: int) -> object:
        nonlocal calls
        calls += 1
        started.set()
        release.wait(5)
        return object()

    cache: EngineCache[int, object] = EngineCache()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.get_or_build, 1, build) for _ in range(8)]
        assert started.wait(5)
        release.set()
        engines = {id(f.result(5)) for f in futures}
    assert calls == 1 and len(engines) == 1


def test_a_failed_build_stores_nothing() -> None:
    cache: EngineCache[int, str] = EngineCache()

    def fail(key: int) -> str:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get_or_build(1, fail)
    assert cache == {}
    assert cache.get_or_build(1, str) == "1"


def test_rebuild_swaps_every_engine_and_commits_under_the_lock() -> None:
    cache: EngineCache[int, tuple[str, int]] = EngineCache()
    weights = ["old"]
    for key in (1, 2):
        cache.get_or_build(key, lambda k: (weights[0], k))

    def build(key: int) -> tuple[str, int]:
        # a call with a new signature during the rebuild: built from the old weights
        cache.get_or_build(3, lambda k: (weights[0], k))
        return ("new", key)

    cache.rebuild(build, commit=lambda: weights.__setitem__(0, "new"))
    assert cache == {1: ("new", 1), 2: ("new", 2)}  # the old-weights engine for 3 is dropped
    assert cache.get_or_build(3, lambda k: (weights[0], k)) == ("new", 3)


def test_a_failed_rebuild_changes_nothing() -> None:
    cache: EngineCache[int, str] = EngineCache()
    cache.get_or_build(1, lambda k: "old")
    committed: list[bool] = []

    def fail(key: int) -> str:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.rebuild(fail, commit=lambda: committed.append(True))
    assert cache == {1: "old"} and committed == []


def test_clear_closes_each_engine_then_forgets_them() -> None:
    closed: list[str] = []
    cache: EngineCache[int, str] = EngineCache()
    for key in (1, 2):
        cache.get_or_build(key, str)
    cache.clear(closed.append)
    assert closed == ["1", "2"] and cache == {}
    cache.get_or_build(1, str)
    cache.clear()
    assert cache == {}
