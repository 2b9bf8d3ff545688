"""Opt-in: build ggml for this machine from libggml-python's own sources.

    python -m sdkit_ggml.runtime.native_build [--dest DIR] [--no-openmp] [--no-llamafile] [--jobs N]

The PyPI wheel of libggml-python is one portable CPU build (AVX2/FMA/F16C/BMI2, no llamafile
sgemm, no OpenMP, no AVX-512 variant). This command fetches the sdist of the *installed*
libggml-python version with pip (the ggml sources of the same release, so the bindings'
version check still holds), configures it with ``GGML_NATIVE`` (the ISA of this CPU),
``GGML_LLAMAFILE`` (tinyBLAS sgemm for f32/f16 mul_mat) and ``GGML_OPENMP``, builds the shared
libraries with CMake and copies them to ``--dest``. It needs a C/C++ compiler and CMake; users
who do not run it keep the prebuilt wheel and need neither. Built into the default folder (no
``--dest``), sdkit-ggml loads it from then on by itself, as long as it matches the installed
libggml-python and this CPU (``native.py``); built elsewhere, point ``SDKIT_GGML_LIB_DIR`` at it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from sdkit_ggml.runtime.native import PACKAGE, default_dest, write_record


def cmake_flags(native: bool = True, llamafile: bool = True, openmp: bool = True) -> list[str]:
    """The CMake definitions of the build (shared libraries, Release, no tests/examples)."""
    on_off = {True: "ON", False: "OFF"}
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_BUILD_TESTS=OFF",
        "-DGGML_BUILD_EXAMPLES=OFF",
        "-DGGML_CCACHE=OFF",
        f"-DGGML_NATIVE={on_off[native]}",
        f"-DGGML_LLAMAFILE={on_off[llamafile]}",
        f"-DGGML_OPENMP={on_off[openmp]}",
    ]


def ggml_sources(sdist: Path, into: Path) -> Path:
    """Unpack ``sdist`` and return its ggml source folder; SystemExit when it has none (the
    0.20.2 sdist on PyPI was published without its ggml submodule; 0.20.2.post1 has it)."""
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: refuse unsafe members
            archive.extractall(into, filter="data")
        else:  # pragma: no cover - older patch releases
            archive.extractall(into)  # the sdist of the package already installed, from PyPI
    found = [p.parent for p in into.glob("*/ggml/CMakeLists.txt")]
    if not found:
        raise SystemExit(f"{sdist.name} carries no ggml sources; install a {PACKAGE} release whose sdist has them")
    return found[0]


def download_sdist(version: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(into)]
    subprocess.run([*command, f"{PACKAGE}=={version}"], check=True)
    return next(into.glob("*.tar.gz"))


def build(sources: Path, dest: Path, flags: list[str], jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cmake", "-S", str(sources), "-B", tmp, *flags], check=True)
        subprocess.run(["cmake", "--build", tmp, "-j", str(jobs)], check=True)
        dest.mkdir(parents=True, exist_ok=True)
        for library in Path(tmp).rglob("libggml*"):
            if library.is_file() and (".so" in library.name or library.suffix in (".dylib", ".dll")):
                shutil.copy2(library, dest / library.name, follow_symlinks=True)
        for stem in ("libggml-base", "libggml-cpu", "libggml"):  # the names the loader opens
            versioned = sorted(dest.glob(f"{stem}.so.*"))
            if versioned and not (dest / f"{stem}.so").exists():
                shutil.copy2(versioned[-1], dest / f"{stem}.so")


def features_of(dest: Path) -> str:
    """Load the new build in a fresh process and report its CPU backend's features."""
    code = (
        "from sdkit_ggml.runtime.lib import load_library; from sdkit_ggml.runtime.buildinfo import backend_features; "
        "print(', '.join(f'{k}={v}' for k, v in backend_features(load_library()).items()))"
    )
    env = {**os.environ, "SDKIT_GGML_LIB_DIR": str(dest)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"the build in {dest} does not load: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dest", type=Path, default=None, help="where the libraries go")
    parser.add_argument("--no-native", action="store_true", help="portable ISA instead of -march=native")
    parser.add_argument("--no-llamafile", action="store_true")
    parser.add_argument("--no-openmp", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    version = importlib.metadata.version(PACKAGE)
    dest = args.dest or default_dest(version)
    flags = cmake_flags(not args.no_native, not args.no_llamafile, not args.no_openmp)
    with tempfile.TemporaryDirectory() as tmp:
        sources = ggml_sources(download_sdist(version, Path(tmp)), Path(tmp) / "src")
        build(sources, dest, flags, args.jobs)
    features = features_of(dest)
    write_record(dest, version, flags)
    print(f"built ggml {version} for this machine: {features}")
    if args.dest is None:
        print(f"sdkit-ggml uses it from now on ({dest}); SDKIT_GGML_NATIVE=0 turns that off")
    else:
        print(f"export SDKIT_GGML_LIB_DIR={dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
