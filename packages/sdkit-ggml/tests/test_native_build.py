"""The opt-in native ggml build: its CMake flags and how it finds the ggml sources in an sdist."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from sdkit.cpu_features import cpu_info
from sdkit_ggml.runtime import lib, native
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


# --- the machine build, found and checked by sdkit_ggml.runtime.native -----------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SDKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SDKIT_GGML_LIB_DIR", raising=False)
    monkeypatch.delenv(native.OPT_OUT, raising=False)
    native._warned.clear()
    return tmp_path


def machine_build(version: str) -> Path:
    """A folder as native_build leaves it (the libraries are not needed to choose it)."""
    dest = native.default_dest(version)
    dest.mkdir(parents=True)
    native.write_record(dest, version, cmake_flags())
    return dest


def edit_record(dest: Path, **changes: object) -> None:
    path = dest / native.RECORD
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


needs_version = pytest.mark.skipif(native.installed_version() is None, reason="libggml-python is not installed")


@needs_version
def test_the_build_made_for_this_machine_is_chosen(cache: Path) -> None:
    assert native.native_dir() is None  # none made yet: the wheel's build
    dest = machine_build(str(native.installed_version()))
    assert native.native_dir() == dest
    assert lib.library_dir() == dest
    record = json.loads((dest / native.RECORD).read_text())
    assert record["machine"] == cpu_info().machine and "-DGGML_LLAMAFILE=ON" in record["cmake"]


@needs_version
def test_sdkit_ggml_lib_dir_and_the_opt_out_take_precedence(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    machine_build(str(native.installed_version()))
    monkeypatch.setenv("SDKIT_GGML_LIB_DIR", str(cache / "mine"))
    assert lib.library_dir() == cache / "mine"
    monkeypatch.delenv("SDKIT_GGML_LIB_DIR")
    monkeypatch.setenv(native.OPT_OUT, "0")
    assert native.native_dir() is None
    assert lib.library_dir() == lib._package_dir()


@needs_version
@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"libggml_python": "0.19.0"}, "built from libggml-python 0.19.0"),
        ({"machine": "aarch64"}, "built for aarch64"),
        ({"isa_flags": ["avx2", "avx512_imaginary"]}, "this CPU lacks avx512_imaginary"),
    ],
)
def test_a_build_made_for_something_else_is_ignored_with_the_reason(
    cache: Path, changes: dict[str, object], reason: str
) -> None:
    dest = machine_build(str(native.installed_version()))
    edit_record(dest, **changes)
    with pytest.warns(RuntimeWarning, match=reason):
        assert native.native_dir() is None
    assert lib.library_dir() == lib._package_dir()


@needs_version
def test_an_unreadable_record_is_ignored(cache: Path) -> None:
    dest = machine_build(str(native.installed_version()))
    (dest / native.RECORD).write_text("{not json")
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert native.native_dir() is None


@needs_version
def test_a_machine_build_that_does_not_load_gives_way_to_the_wheel(cache: Path) -> None:
    dest = machine_build(str(native.installed_version()))
    (dest / "libggml.so").write_bytes(b"not a shared library")
    with pytest.warns(RuntimeWarning, match="does not load"):
        loaded = lib._load_or_fall_back(dest)
    assert loaded.directory == lib._package_dir()


def test_sdkit_backends_names_the_gpu_backends_of_the_machine_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdkit_ggml.runtime.buildinfo import build_note

    loaded = lib.load_library()
    monkeypatch.setattr(native, "native_dir", lambda: loaded.directory)
    monkeypatch.setattr(native, "gpu_backends_of", lambda dest: ["cuda", "vulkan"])
    note = build_note(loaded)
    assert note.startswith(" (built for this machine: ") and note.endswith(", CUDA, VULKAN)")


# --- a prebuilt ggml installed as a package (tools/ggml_vulkan_wheel.py: sdkit-ggml-vulkan) --------


def prebuilt_package(root: Path, version: str) -> Path:
    """``root/sdkit_ggml_vulkan/lib`` as the wheel installs it (libraries are not needed to choose it)."""
    folder = root / "sdkit_ggml_vulkan" / "lib"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    native.write_record(folder, version, cmake_flags(native=False, openmp=False))
    return folder


@needs_version
def test_an_installed_prebuilt_vulkan_build_is_chosen_after_the_machine_build(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(cache / "site"))
    folder = prebuilt_package(cache / "site", str(native.installed_version()))
    assert native.prebuilt_dir() == folder
    assert lib.library_dir() == folder
    dest = machine_build(str(native.installed_version()))  # the user's own build wins
    assert lib.library_dir() == dest
    monkeypatch.setenv(native.OPT_OUT, "0")  # and the opt-out leaves libggml-python's
    assert lib.library_dir() == lib._package_dir()


@needs_version
def test_a_prebuilt_build_of_another_libggml_python_is_ignored(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(cache / "site"))
    prebuilt_package(cache / "site", "0.19.0")
    with pytest.warns(RuntimeWarning, match="built for libggml-python 0.19.0"):
        assert native.prebuilt_dir() is None
    assert lib.library_dir() == lib._package_dir()
