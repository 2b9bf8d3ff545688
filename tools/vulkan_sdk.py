"""What building ggml's Vulkan backend needs on a Debian/Ubuntu x86_64 machine, made present.

    .venv/bin/python tools/vulkan_sdk.py [--apt] [--prefix DIR]    # a Python with sdkit-ggml

ggml 0.20.2's ``ggml-vulkan.cpp`` needs Vulkan headers that declare ``VK_EXT_layer_settings``
(``vk::LayerSettingEXT``; Vulkan-Headers 1.3.261 and later) and SPIRV-Headers' CMake package.
Debian bookworm ships 1.3.239 (``ggml-vulkan.cpp`` then fails to compile); Debian trixie's
1.4.309 works. Headers are all a build needs from them: the built ``libggml-vulkan.so`` links
only the Vulkan loader (``libvulkan.so.1``), which every GPU driver installs, and the system's
loader stays the one used.

``--apt`` installs the build tools and Mesa's Vulkan drivers with apt-get (root): cmake, g++,
glslc, the loader (libvulkan-dev), spirv-headers, and mesa-vulkan-drivers, whose lavapipe is a
Vulkan device running on the CPU (how sdkit's ``vulkan`` tests run without a GPU). On Debian
bookworm Mesa comes from bookworm-backports (25.0, the version the tests were measured with;
bookworm's own is 22.3), which it adds to apt's sources if absent.

When the system's headers are older than that, the two header packages of Debian trixie
(pinned versions, checked against their SHA-256) are downloaded from deb.debian.org and
unpacked into ``--prefix`` (default: ``<sdkit cache>/vulkan-sdk/<version>``), nothing installed
system-wide. The last line printed is the prefix to pass as ``native_build --vulkan-sdk``
(empty when the system's headers do).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from sdkit_ggml.runtime.gpu_build import SYSTEM_PREFIXES, spirv_config_dir, vulkan_header_problem

HEADERS_VERSION = "1.4.309"
MIRROR = "http://deb.debian.org/debian/pool/main"
# (path under the mirror's pool, SHA-256): header-only content is used from each.
DEBS = (
    (
        "v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb",
        "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a",
    ),
    (
        "s/spirv-headers/spirv-headers_1.6.1+1.4.309.0-1_all.deb",
        "dc18db866d63680351c40ac6b6bece34cb52da64a7799ce1cc4f16f6bff4d064",
    ),
)
APT_PACKAGES = ("cmake", "g++", "glslc", "libvulkan-dev", "spirv-headers")
MESA = "mesa-vulkan-drivers"
BACKPORTS = Path("/etc/apt/sources.list.d/sdkit-bookworm-backports.list")


def usable(prefixes: list[Path]) -> bool:
    """Whether ``prefixes`` hold Vulkan headers new enough for ggml-vulkan and SPIRV-Headers'
    CMake package, as ``native_build --vulkan``'s pre-flight (``gpu_build``) judges them."""
    header = next(
        (p / "include/vulkan/vulkan_core.h" for p in prefixes if (p / "include/vulkan/vulkan_core.h").is_file()), None
    )
    return header is not None and not vulkan_header_problem(header) and spirv_config_dir(prefixes) is not None


def system_ok() -> bool:
    return usable(list(SYSTEM_PREFIXES))


def apt_install() -> None:
    if shutil.which("apt-get") is None:
        raise SystemExit("vulkan_sdk: --apt needs apt-get (Debian/Ubuntu); install the same tools another way")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    mesa = [MESA]
    if codename() == "bookworm":
        if not BACKPORTS.exists() and "bookworm-backports" not in apt_sources():
            BACKPORTS.write_text("deb http://deb.debian.org/debian bookworm-backports main\n")
        mesa = ["-t", "bookworm-backports", MESA]
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *mesa], check=True, env=env)


def codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    found = [
        line.split("=", 1)[1].strip().strip('"') for line in text.splitlines() if line.startswith("VERSION_CODENAME=")
    ]
    return found[0] if found else ""


def apt_sources() -> str:
    files = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    return "".join(f.read_text(errors="replace") for f in files if f.is_file())


def fetch(pool_path: str, sha256: str, into: Path) -> Path:
    target = into / pool_path.rsplit("/", 1)[1]
    with urllib.request.urlopen(
        f"{MIRROR}/{pool_path}", timeout=120
    ) as response:  # a fixed Debian mirror; hash-checked
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"vulkan_sdk: {target.name} has SHA-256 {digest}, expected {sha256}")
    target.write_bytes(data)
    return target


def unpack_headers(prefix: Path) -> Path:
    """Download and unpack the pinned header packages into ``prefix``; returns ``prefix/usr``."""
    if shutil.which("dpkg-deb") is None:
        raise SystemExit("vulkan_sdk: unpacking the header packages needs dpkg-deb (Debian/Ubuntu)")
    prefix.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for pool_path, sha256 in DEBS:
            deb = fetch(pool_path, sha256, Path(tmp))
            subprocess.run(["dpkg-deb", "-x", str(deb), str(prefix)], check=True)
    usr = prefix / "usr"
    # The unpacked libvulkan.so is a link to the loader the package depends on: use the system's.
    for link in usr.glob("lib/*/libvulkan.so*"):
        link.unlink()
    if not usable([usr]):
        raise SystemExit(f"vulkan_sdk: {prefix} lacks the Vulkan or SPIRV headers after unpacking")
    return usr


def default_prefix() -> Path:
    try:
        from sdkit.cache import cache_root  # the venv's sdkit, where there is one
    except ImportError:
        return Path.home() / ".cache" / "sdkit" / "vulkan-sdk" / HEADERS_VERSION
    return cache_root() / "vulkan-sdk" / HEADERS_VERSION


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--apt", action="store_true", help="apt-get install the build tools and Mesa's drivers")
    parser.add_argument("--prefix", type=Path, default=None, help="where newer headers are unpacked")
    args = parser.parse_args(argv)
    if args.apt:
        apt_install()
    if system_ok():
        print("vulkan_sdk: the system's Vulkan and SPIRV headers are new enough")
        print("")
        return 0
    prefix = args.prefix or default_prefix()
    usr = prefix / "usr"
    if not usable([usr]):
        usr = unpack_headers(prefix)
    print(f"vulkan_sdk: Vulkan headers {HEADERS_VERSION} in {usr}")
    print(usr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
