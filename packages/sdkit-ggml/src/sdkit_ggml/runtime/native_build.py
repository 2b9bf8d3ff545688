"""Opt-in: build ggml for this machine from libggml-python's own sources.

    python -m sdkit_ggml.runtime.native_build [--dest DIR] [--no-openmp] [--no-llamafile] [--jobs N]
        [--cuda [--cuda-arch 90] [--cuda-root PREFIX] [--cublas PREFIX]] [--vulkan [--vulkan-sdk PREFIX]]
        [--sources SDIST_OR_FOLDER]

The PyPI wheel of libggml-python is one portable CPU build (AVX2/FMA/F16C/BMI2, no llamafile
sgemm, no OpenMP, no AVX-512 variant). This command fetches the sdist of the *installed*
libggml-python version with pip (the ggml sources of the same release, so the bindings'
version check still holds), configures it with ``GGML_NATIVE`` (the ISA of this CPU),
``GGML_LLAMAFILE`` (tinyBLAS sgemm for f32/f16 mul_mat) and ``GGML_OPENMP``, builds the shared
libraries with CMake and copies them to ``--dest``. ``--cuda`` / ``--vulkan`` add ggml's GPU
backends (``gpu_build.py``: what each needs, checked before anything is downloaded); sdkit-ggml
then lists their ``cuda:N`` / ``vulkan:N`` devices. ``--sources`` takes an already downloaded
sdist (or its unpacked folder) instead of asking pip, for machines without a package index.
It needs a C/C++ compiler and CMake; users who do not run it keep the prebuilt wheel and need
neither. Built into the default folder (no ``--dest``), sdkit-ggml loads it from then on by
itself, as long as it matches the installed libggml-python and this CPU (``native.py``);
built elsewhere, point ``SDKIT_GGML_LIB_DIR`` at it.
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

from sdkit_ggml.runtime.gpu_build import BACKENDS, GpuBackend, GpuOptions, missing_general_tools, preflight
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


def local_sources(given: Path, version: str, into: Path) -> Path:
    """The ggml folder of ``--sources``: an sdist archive, its unpacked folder or a ggml checkout.
    SystemExit when it is not there, has no ggml sources, or is another release than the one
    installed (the bindings check the version of the library they load)."""
    if not given.exists():
        raise SystemExit(f"--sources {given}: no such file or folder")
    name = given.name.removesuffix(".tar.gz")
    release = name.split("-", 1)[1] if name.startswith(("libggml_python-", "libggml-python-")) else None
    if release is not None and release != version:
        raise SystemExit(f"--sources {given} is libggml-python {release}, {version} is installed")
    if given.is_file():
        return ggml_sources(given, into)
    for candidate in (given, given / "ggml"):
        if (candidate / "CMakeLists.txt").is_file() and (candidate / "src" / "ggml.c").is_file():
            return candidate
    raise SystemExit(f"--sources {given} holds no ggml sources (ggml/CMakeLists.txt, ggml/src/ggml.c)")


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
        add_unversioned_names(dest)


def add_unversioned_names(dest: Path) -> None:
    """``libggml-cuda.so`` beside ``libggml-cuda.so.0.9.4``: the names the loader opens."""
    stems = {p.name.split(".so.", 1)[0] for p in dest.glob("libggml*.so.*")}
    for stem in sorted(stems):
        versioned = sorted(dest.glob(f"{stem}.so.*"))
        if not (dest / f"{stem}.so").exists():
            shutil.copy2(versioned[-1], dest / f"{stem}.so")


def features_of(dest: Path) -> tuple[str, list[str]]:
    """Load the new build in a fresh process: its CPU backend's features and its devices."""
    code = (
        "from sdkit_ggml.runtime.lib import load_library; from sdkit_ggml.runtime.buildinfo import backend_features; "
        "from sdkit_ggml.runtime.devices import list_devices; lib = load_library(); "
        "print(', '.join(f'{k}={v}' for k, v in backend_features(lib).items())); "
        "print(' '.join(str(d.device) for d in list_devices(lib)))"
    )
    env = {**os.environ, "SDKIT_GGML_LIB_DIR": str(dest)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"the build in {dest} does not load: {proc.stderr.strip().splitlines()[-1:]}")
    lines = [*proc.stdout.strip().splitlines(), "", ""]
    return lines[0], lines[1].split()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dest", type=Path, default=None, help="where the libraries go")
    parser.add_argument("--no-native", action="store_true", help="portable ISA instead of -march=native")
    parser.add_argument("--no-llamafile", action="store_true")
    parser.add_argument("--no-openmp", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--sources", type=Path, help="libggml-python's sdist (or its unpacked folder) instead of pip")
    for backend in BACKENDS:
        parser.add_argument(backend.option, action="store_true", help=f"add ggml's {backend.name} backend")
    parser.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES (default: this machine's GPUs, nvidia-smi)")
    parser.add_argument("--cuda-root", type=Path, help="the CUDA toolkit (the folder holding bin/nvcc)")
    parser.add_argument("--cublas", type=Path, help="a cuBLAS prefix (include/, lib/), e.g. the nvidia-cublas wheel's")
    parser.add_argument("--check", action="store_true", help="the pre-flight and the sources only: print the flags")
    parser.add_argument("--vulkan-sdk", type=Path, help="a prefix with include/vulkan and share/cmake/SPIRV-Headers")
    return parser.parse_args(argv)


def chosen_backends(args: argparse.Namespace) -> list[GpuBackend]:
    return [b for b in BACKENDS if getattr(args, b.option.lstrip("-").replace("-", "_"))]


def build_flags(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(CMake flags, GPU backend names); SystemExit naming every missing tool at once."""
    backends = chosen_backends(args)
    flags = cmake_flags(not args.no_native, not args.no_llamafile, not args.no_openmp)
    if backends:
        options = GpuOptions(args.cuda_root, args.cublas, args.cuda_arch, args.vulkan_sdk)
        flags += preflight(backends, options)
    else:
        missing = missing_general_tools()
        if missing:
            raise SystemExit("cannot build ggml here, missing:\n" + "\n".join(f"  - {m}" for m in missing))
    return flags, [b.name for b in backends]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    version = importlib.metadata.version(PACKAGE)
    dest = args.dest or default_dest(version)
    flags, gpus = build_flags(args)  # before any download: every missing tool named at once
    with tempfile.TemporaryDirectory() as tmp:
        if args.sources:
            sources = local_sources(args.sources, version, Path(tmp) / "src")
        else:
            sources = ggml_sources(download_sdist(version, Path(tmp)), Path(tmp) / "src")
        if args.check:
            print(f"ready to build {sources.name} of libggml-python {version} with: {' '.join(flags)}")
            return 0
        build(sources, dest, flags, args.jobs)
    features, devices = features_of(dest)
    write_record(dest, version, flags, gpus)
    print(f"built ggml {version} for this machine: {features}; devices: {' '.join(devices) or 'none'}")
    for name in gpus:
        if not any(d.startswith(f"{name}:") or d == name for d in devices):
            print(f"warning: built with {name}, but ggml lists no {name} device here (no GPU, or no driver?)")
    if args.dest is None:
        print(f"sdkit-ggml uses it from now on ({dest}); SDKIT_GGML_NATIVE=0 turns that off")
    else:
        print(f"export SDKIT_GGML_LIB_DIR={dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
