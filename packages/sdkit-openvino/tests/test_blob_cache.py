"""OpenVINO's CACHE_DIR blobs are verified against sdkit's sums before OpenVINO imports them
(issue 15, finding 3: 4 KiB flipped in a blob gave wrong outputs on every later run), and a
cache that cannot be used turns itself off with a warning instead of failing (finding 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sdkit
from sdkit.cache import CacheWarning
from sdkit.testing import compare_with_reference
from sdkit_openvino.blob_cache import MANIFEST

from .test_compile import conv_relu_model

SHAPES = {"x": (1, 3, 16, 16)}
FEEDS = {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _compile_and_run(model: sdkit.Model) -> tuple[np.ndarray, bool]:
    compiled = sdkit.compile(model, backend="openvino", input_shapes=SHAPES, threads=1)
    return compiled.run(FEEDS)["y"], bool(compiled.info["compiles"][-1]["from_cache"])  # type: ignore[attr-defined]


def _blob(cache: Path) -> Path:
    (blob,) = list((cache / "openvino").rglob("*.blob"))
    return blob


def _damage(blob: Path, how: str) -> None:
    size = blob.stat().st_size
    if how == "flipped":
        with blob.open("r+b") as f:
            f.seek(size // 2)
            chunk = f.read(4096)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in chunk))
    elif how == "truncated":
        with blob.open("r+b") as f:
            f.truncate(size // 3)
    elif how == "replaced":
        blob.write_bytes(os.urandom(size))
    elif how == "manifest lost":
        (blob.parent / MANIFEST).unlink()
    elif how == "manifest forged":
        (blob.parent / MANIFEST).write_text(json.dumps({blob.name: "0" * 64}))


@pytest.mark.parametrize("how", ["flipped", "truncated", "replaced", "manifest lost", "manifest forged"])
def test_damaged_blob_is_rebuilt_not_trusted(sdkit_isolated: Path, how: str) -> None:
    model = conv_relu_model()
    expected, hit = _compile_and_run(model)
    assert not hit
    assert max(compare_with_reference({"y": expected}, model, FEEDS).values()) < 1e-4
    _damage(_blob(sdkit_isolated), how)
    again, hit = _compile_and_run(model)
    assert not hit  # recompiled: the damaged blob was removed before OpenVINO could import it
    np.testing.assert_array_equal(again, expected)
    third, hit = _compile_and_run(model)  # and the rebuilt blob is trusted again
    assert hit
    np.testing.assert_array_equal(third, expected)


def test_unknown_files_in_the_cache_are_removed(sdkit_isolated: Path) -> None:
    model = conv_relu_model()
    _compile_and_run(model)
    stray = _blob(sdkit_isolated).parent / "planted.blob"
    stray.write_bytes(b"not OpenVINO's")
    _, hit = _compile_and_run(model)
    assert hit and not stray.exists()


def test_unwritable_cache_compiles_without_it(sdkit_isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder that cannot be created (here: its parent is a file; chmod does not stop
    root) used to fail every compile."""
    blocker = sdkit_isolated.parent / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SDKIT_CACHE_DIR", str(blocker / "cache"))
    model = conv_relu_model()
    with pytest.warns(CacheWarning, match="compiling without it"):
        out, hit = _compile_and_run(model)
    assert not hit
    assert max(compare_with_reference({"y": out}, model, FEEDS).values()) < 1e-4


_TWO_PROCESSES = """
import sys, numpy as np, sdkit
sys.path.insert(0, {tests!r})
from test_compile import conv_relu_model
model = conv_relu_model()
x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
out = sdkit.compile(model, backend="openvino", input_shapes={{"x": (1, 3, 16, 16)}}, threads=1).run({{"x": x}})["y"]
np.save(sys.argv[1], out)
"""


def test_two_processes_compile_into_one_cache(sdkit_isolated: Path, tmp_path: Path) -> None:
    code = _TWO_PROCESSES.format(tests=str(Path(__file__).parent))
    outs = [tmp_path / f"out{i}.npy" for i in range(3)]
    children = [subprocess.Popen([sys.executable, "-c", code, str(o)]) for o in outs]
    assert [c.wait(timeout=300) for c in children] == [0, 0, 0]
    results = [np.load(o) for o in outs]
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    model = conv_relu_model()
    out, hit = _compile_and_run(model)  # one intact blob, trusted by the next compile
    assert hit
    np.testing.assert_array_equal(out, results[0])
    assert len(list((sdkit_isolated / "openvino").rglob("*.blob"))) == 1
