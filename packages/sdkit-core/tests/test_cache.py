"""The compiled-artifact cache: keyed reuse, corrupt or stale entries rebuilt, never trusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdkit.cache import ArtifactCache, cache_root, make_key


def _key(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "graph_hash": "g1",
        "backend": "fake",
        "backend_version": "1.0",
        "device": "cpu",
        "options": {"precision": "fp32"},
        "input_shapes": {"x": (1, 3)},
    }
    fields.update(overrides)
    return make_key(**fields)  # type: ignore[arg-type]


class Builder:
    def __init__(self) -> None:
        self.builds = 0

    def build(self, folder: Path) -> None:
        self.builds += 1
        (folder / "engine.bin").write_bytes(b"compiled-%d" % self.builds)

    @staticmethod
    def load(folder: Path) -> bytes:
        data = (folder / "engine.bin").read_bytes()
        if not data.startswith(b"compiled-"):
            raise ValueError("corrupt engine")
        return data


def test_root_follows_environment(sdkit_isolated: Path) -> None:
    assert cache_root() == sdkit_isolated


def test_second_use_hits(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    first, hit1 = cache.load_or_build(_key(), builder.build, builder.load)
    second, hit2 = cache.load_or_build(_key(), builder.build, builder.load)
    assert (hit1, hit2) == (False, True)
    assert first == second and builder.builds == 1


@pytest.mark.parametrize(
    "change",
    [
        {"graph_hash": "g2"},
        {"backend_version": "1.1"},
        {"device": "cuda:0"},
        {"options": {"precision": "fp16"}},
        {"input_shapes": {"x": (2, 3)}},
        {"weights_hash": "w1"},
    ],
)
def test_every_key_field_separates_entries(tmp_path: Path, change: dict[str, object]) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    cache.load_or_build(_key(), builder.build, builder.load)
    _, hit = cache.load_or_build(_key(**change), builder.build, builder.load)
    assert not hit and builder.builds == 2


def test_tampered_file_is_rebuilt(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    cache.load_or_build(_key(), builder.build, builder.load)
    folder = cache.entry_dir(_key())
    (folder / "engine.bin").write_bytes(b"compiled-1 but changed on disk")
    value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert not hit and value == b"compiled-2"


def test_missing_manifest_or_half_written_entry_is_rebuilt(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    folder = cache.entry_dir(_key())
    folder.mkdir(parents=True)
    (folder / "engine.bin").write_bytes(b"compiled-99")  # no manifest: a crash mid-write
    value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert not hit and value == b"compiled-1"


def test_entry_that_fails_to_load_is_rebuilt(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    cache.store(_key(), lambda folder: (folder / "engine.bin").write_bytes(b"garbage"))
    builder = Builder()
    value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert not hit and value == b"compiled-1"


def test_manifest_for_another_key_is_not_trusted(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    cache.load_or_build(_key(), builder.build, builder.load)
    other = _key(graph_hash="g2")
    cache.entry_dir(other).parent.mkdir(parents=True, exist_ok=True)
    cache.entry_dir(_key()).rename(cache.entry_dir(other))  # stale entry under another key
    assert cache.lookup(other) is None
    assert not cache.entry_dir(other).exists()


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)

    def explode(folder: Path) -> None:
        (folder / "partial.bin").write_bytes(b"x")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError):
        cache.store(_key(), explode)
    assert not cache.entry_dir(_key()).exists()
    assert list(cache.entry_dir(_key()).parent.iterdir()) == []


def test_manifest_that_is_not_an_object_is_rebuilt(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    cache.load_or_build(_key(), builder.build, builder.load)
    (cache.entry_dir(_key()) / "sdkit-manifest.json").write_text("[1]")
    value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert not hit
    assert value == b"compiled-2"


def test_an_entry_stored_meanwhile_by_another_writer_wins(tmp_path: Path) -> None:
    cache, builder = ArtifactCache(tmp_path), Builder()
    first = cache.store(_key(), builder.build)
    again = cache.store(_key(), builder.build)  # as if a second process finished later
    assert again == first
    assert Builder.load(first) == b"compiled-1"


def test_unwritable_cache_builds_without_it(tmp_path: Path) -> None:
    """Issue 15, finding 5: an unwritable cache failed every compile. Now it warns and builds
    in a scratch folder (a cache root under a file: not writable even for root)."""
    from sdkit.cache import CacheWarning

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache, builder = ArtifactCache(blocker / "cache"), Builder()
    with pytest.warns(CacheWarning, match="compiling without it"):
        value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert (value, hit) == (b"compiled-1", False)
    with pytest.warns(CacheWarning):
        assert cache.store(_key(), builder.build) is None
    assert cache.lookup(_key()) is None


def test_cache_that_fails_while_committing_builds_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdkit.cache import CacheWarning

    cache, builder = ArtifactCache(tmp_path), Builder()

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ArtifactCache, "_commit", disk_full)
    with pytest.warns(CacheWarning, match="No space left"):
        value, hit = cache.load_or_build(_key(), builder.build, builder.load)
    assert not hit and value.startswith(b"compiled-")
    assert not list(cache.root.rglob(".tmp-*"))  # no half-written entry left behind
