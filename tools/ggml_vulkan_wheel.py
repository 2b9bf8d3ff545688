"""A redistributable ggml-Vulkan for Linux x86_64, as a wheel sdkit-ggml picks up by itself.

    .venv/bin/python tools/ggml_vulkan_wheel.py [--build DIR] [--dist dist] [--jobs N]

Builds ggml (libggml-python's installed release, from its sdist) with the Vulkan backend and a
portable CPU part (``native_build --vulkan --no-native --no-openmp``: no ``-march=native``, no
libgomp), or takes an existing such build (``--build``), strips the libraries and writes
``dist/sdkit_ggml_vulkan-<version>-py3-none-linux_x86_64.whl``: a package ``sdkit_ggml_vulkan``
holding ``lib/libggml*.so`` and the build's record, requiring the same libggml-python. Installed
next to sdkit-ggml, ``sdkit_ggml.runtime.native.prebuilt_dir`` finds it (no compiler, no setting
on the user's machine; ``sdkit backends`` then lists ``vulkan:N``). The libraries need only the
Vulkan loader (``libvulkan.so.1``), which the GPU driver installs, and glibc/libstdc++; where
the loader is missing, sdkit-ggml falls back to libggml-python's CPU build with a warning.
The platform tag is plain ``linux_x86_64``: the wheel is built against this machine's glibc
(Debian bookworm: 2.36) and not audited for manylinux. Needs what ``dev.py vulkan`` needs
(``tools/vulkan_sdk.py``). Prints the wheel's size and its installed size.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "sdkit_ggml_vulkan"
RECORD = "sdkit-native-build.json"


def build(dest: Path, jobs: int) -> None:
    sdk = subprocess.run([sys.executable, str(ROOT / "tools" / "vulkan_sdk.py")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()  # fmt: skip
    prefix = ["--vulkan-sdk", sdk[-1]] if sdk and sdk[-1] else []
    command = [sys.executable, "-m", "sdkit_ggml.runtime.native_build", "--vulkan", "--no-native", "--no-openmp"]
    subprocess.run([*command, *prefix, "--dest", str(dest), "--jobs", str(jobs)], check=True)


def libraries(build_dir: Path) -> list[Path]:
    found = sorted(p for p in build_dir.glob("libggml*.so") if p.is_file())
    if not any(p.name == "libggml-vulkan.so" for p in found) or not (build_dir / RECORD).is_file():
        raise SystemExit(f"{build_dir} holds no ggml Vulkan build with its record (run without --build)")
    record = json.loads((build_dir / RECORD).read_text())
    if "-DGGML_NATIVE=ON" in record.get("cmake", []):
        raise SystemExit(f"{build_dir} was built with -march=native: not redistributable (run without --build)")
    return found


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_files(build_dir: Path, version: str, tmp: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {
        f"{NAME}/__init__.py": b'"""ggml built with its Vulkan backend, for sdkit-ggml (libraries in lib/)."""\n'
    }
    for library in libraries(build_dir):
        stripped = tmp / library.name
        shutil.copy2(library, stripped)
        subprocess.run(["strip", "--strip-unneeded", str(stripped)], check=True)
        files[f"{NAME}/lib/{library.name}"] = stripped.read_bytes()
    files[f"{NAME}/lib/{RECORD}"] = (build_dir / RECORD).read_bytes()
    info = f"{NAME}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: sdkit-ggml-vulkan\nVersion: {version}\n"
        "Summary: ggml with its Vulkan backend (NVIDIA, AMD, Intel GPUs) for sdkit-ggml\n"
        f"License: MIT\nRequires-Dist: libggml-python=={version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sdkit tools/ggml_vulkan_wheel.py\n"
        b"Root-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
    )
    record = "".join(f"{name},{_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    return files


def write_wheel(build_dir: Path, dist: Path) -> Path:
    version = importlib.metadata.version("libggml-python")
    dist.mkdir(parents=True, exist_ok=True)
    target = dist / f"{NAME}-{version}-py3-none-linux_x86_64.whl"
    with tempfile.TemporaryDirectory() as tmp:
        files = wheel_files(build_dir, version, Path(tmp))
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    installed = sum(len(d) for n, d in files.items() if not n.endswith("RECORD"))
    print(f"{target}: {target.stat().st_size / 1e6:.1f} MB wheel, {installed / 1e6:.1f} MB installed")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--build", type=Path, help="an existing --no-native Vulkan build to package")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.build is None:
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp), args.jobs)
            write_wheel(Path(tmp), args.dist)
    else:
        write_wheel(args.build, args.dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
