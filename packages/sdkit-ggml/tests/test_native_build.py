"""The opt-in native ggml build: its CMake flags and how it finds the ggml sources in an sdist."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sdkit_ggml.runtime.native_build import cmake_flags, ggml_sources


def make_sdist(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_flags_default_to_native_llamafile_openmp() -> None:
    flags = cmake_flags()
    assert {"-DGGML_NATIVE=ON", "-DGGML_LLAMAFILE=ON", "-DGGML_OPENMP=ON", "-DBUILD_SHARED_LIBS=ON"} <= set(flags)
    off = cmake_flags(native=False, llamafile=False, openmp=False)
    assert {"-DGGML_NATIVE=OFF", "-DGGML_LLAMAFILE=OFF", "-DGGML_OPENMP=OFF"} <= set(off)


def test_sources_found_in_an_sdist_that_has_them(tmp_path: Path) -> None:
    sdist = make_sdist(
        tmp_path / "libggml_python-0.20.2.post1.tar.gz",
        {"libggml_python-0.20.2.post1/ggml/CMakeLists.txt": "project(ggml)", "libggml_python-0.20.2.post1/x": ""},
    )
    found = ggml_sources(sdist, tmp_path / "out")
    assert (found / "CMakeLists.txt").read_text() == "project(ggml)"


def test_an_sdist_without_ggml_sources_is_refused(tmp_path: Path) -> None:
    # libggml-python 0.20.2's sdist was published without its ggml submodule.
    sdist = make_sdist(tmp_path / "libggml_python-0.20.2.tar.gz", {"libggml_python-0.20.2/CMakeLists.txt": ""})
    with pytest.raises(SystemExit, match="carries no ggml sources"):
        ggml_sources(sdist, tmp_path / "out")
