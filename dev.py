#!/usr/bin/env python3
"""Set up and run sdkit from a fresh clone with nothing but Python >= 3.10.

    python3 dev.py demo    # make .venv, install sdkit for this CPU, run the main job (txt2img)
    python3 dev.py test    # make .venv, install every package + test tools, lint, type-check, test
    python3 dev.py wheels  # build every wheel into dist/, for pip install --find-links dist ...
    python3 dev.py extras  # install each extra the README's way in a fresh venv; check and size it
                           # (--write-readme updates the README's size table)
    python3 dev.py vulkan  # build ggml with Vulkan once (reused), run the `vulkan` tests on a Vulkan
                           # device: Mesa's lavapipe (the CPU) where there is no GPU
    python3 dev.py sdcpp   # build stable-diffusion-cpp-python once (reused), run sdkit-sdcpp's tests
                           # (add -m slow for the full-size no-drift checks)

The virtual environment lives in .venv (override with SDKIT_DEV_VENV). Re-running is cheap:
pip skips what is already installed. sdkit 3 is a pre-release (3.0.0.dev0) and PyPI's newest
final sdkit is 2.1.1, so an install line must say ">=3.0.0.dev0" (README, Install).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("SDKIT_DEV_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")

# Plugins that work on a machine without a GPU runtime; GPU vendors' plugins install too
# (their probes say what is missing) but pull no vendor SDK here.
RUNTIME_PACKAGES = ["sdkit-core", "sdkit-ggml", "sdkit-openvino"]
PROBE_ONLY_PACKAGES = ["sdkit-trt", "sdkit-migraphx", "sdkit-coreml"]
TEST_TOOLS = [
    "pytest>=8",
    "pytest-xdist>=3",
    "onnxruntime>=1.17",
    "ruff>=0.6",
    "mypy>=1.10",
    "import-linter>=2.1",
    "hypothesis>=6",  # tests/test_fuzz.py of sdkit-core
    "hatchling>=1.24",  # builds the meta wheel offline for tests/test_install_lines.py
    "opencv-python-headless>=4.8",  # sdkit-core[control]: the ControlNet preprocessor tests
    "scikit-learn>=1.3",  # the tiny_digits test's classifier (load_digits ships in its wheel)
    "gguf>=0.10",  # llama.cpp's GGUF reader/writer: the oracle of sdkit's GGUF header reader
    "tokenizers>=0.15",  # Hugging Face's tokenizers: the oracle of sdkit's CLIP BPE and T5 Unigram
]
# sdkit-coreml's converter runs on any OS (its tests convert every fixture graph to an
# .mlpackage); only running one needs macOS. ~110 MB with sympy, ~1 min to install.
TEST_TOOLS += ["coremltools>=8"]
DIST = ROOT / "dist"
# The HTTP server (an extra of sdkit) with its test tools: httpx, schemathesis (`fuzz`).
SERVER_PACKAGES = ["sdkit-serve"]
SERVER_EXTRAS = "test,fuzz"
# Ray Serve (~360 MB) for the tests marked `ray`; where it cannot be installed they skip.
RAY_REQUIREMENT = "ray[serve]>=2.40"
# mypy --strict ([tool.mypy] in pyproject.toml) on every package; vendor SDKs without type
# information (tensorrt, migraphx, coremltools...) are untyped imports (ignore_missing_imports).
# stable-diffusion.cpp's plugin: installed without its binding (built from source, ~3 min on 2 cores:
# `python3 dev.py sdcpp` builds it once into the sdkit cache); `test` installs a cached build.
SDCPP_PACKAGES = ["sdkit-sdcpp"]
SDCPP_BINDING = "stable-diffusion-cpp-python==0.4.7"
# The cache folder of the binding's wheel: its version and this CPU's flags (a -march=native build).
SDCPP_DEST = (
    "import hashlib; from sdkit.cache import cache_root; from sdkit.cpu_features import cpu_info; "
    "i = cpu_info(); key = hashlib.sha256(' '.join(sorted(i.flags)).encode()).hexdigest()[:12]; "
    "print(cache_root() / 'sdcpp' / f'0.4.7-cpu-{i.machine}-{key}')"
)
TYPED = [f"packages/{n}/src" for n in RUNTIME_PACKAGES + PROBE_ONLY_PACKAGES + SERVER_PACKAGES + SDCPP_PACKAGES]


def sh(*args: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True, cwd=ROOT, env=env)


def existing(names: list[str]) -> list[str]:
    return [n for n in names if (ROOT / "packages" / n / "pyproject.toml").is_file()]


def ensure_venv() -> None:
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")


def pip_install(*args: str) -> None:
    sh(PY, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args)


def install(packages: list[str], no_deps: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> None:
    editable = [a for n in existing(packages) for a in ("-e", f"packages/{n}")]
    pip_install(*editable, *extra)
    probe_only = [a for n in existing(list(no_deps)) for a in ("-e", f"packages/{n}")]
    if probe_only:
        # Vendor SDKs (TensorRT, coremltools...) are useless without their hardware: install
        # the plugins alone, their probes say what is missing.
        pip_install("--no-deps", *probe_only)


def demo() -> int:
    """The main job: txt2img with the repo's tiny_digits model (SD's architecture at small size,
    trained here on scikit-learn's digits: models/tiny-digits), a 0-9 grid with it, then a real
    photo through the real TAEF2 autoencoder."""
    ensure_venv()
    install(RUNTIME_PACKAGES)
    prompt = " ".join(sys.argv[2:]) or "a handwritten digit seven"
    model = "models/tiny-digits/tiny_digits.safetensors"
    txt2img = ["--steps", "20", "--cfg-scale", "5", "--seed", "1", "-o", "out/txt2img.png", "--force"]
    sh(BIN / "sdkit", "generate", "--model", model, prompt, *txt2img)
    sh(PY, "examples/tiny_digits_grid.py", "--out", "out/digits_grid.png")
    sh(PY, "examples/taef2_roundtrip.py", "--out", "out/dog_roundtrip.png")
    print(f"demo images in {ROOT / 'out'}: txt2img.png ({prompt!r}), digits_grid.png (0-9), dog_roundtrip.png (TAEF2)")
    return 0


def install_server() -> None:
    servers = [a for n in existing(SERVER_PACKAGES) for a in ("-e", f"packages/{n}[{SERVER_EXTRAS}]")]
    if servers:
        pip_install(*servers)
        try:
            pip_install(RAY_REQUIREMENT)
        except subprocess.CalledProcessError:
            print(f"dev.py: {RAY_REQUIREMENT} does not install here; the tests marked `ray` will skip", flush=True)


def test() -> int:
    ensure_venv()
    install(RUNTIME_PACKAGES, no_deps=tuple(PROBE_ONLY_PACKAGES), extra=tuple(TEST_TOOLS))
    install_server()
    install_sdcpp(build=False)
    sh(BIN / "ruff", "check", ".")
    sh(BIN / "ruff", "format", "--check", ".")
    sh(PY, "-m", "mypy", *[p for p in TYPED if (ROOT / p).is_dir()])
    sh(BIN / "lint-imports", "--no-logo")  # the import graph's layers (.importlinter)
    sh(PY, "tools/check_code_shape.py")  # no function over 80 lines in packages/*/src
    env = dict(os.environ)
    for var in ("SDKIT_BACKEND", "SDKIT_DISABLE_PLUGINS", "SDKIT_STRICT_PLUGINS", "SDKIT_CONFIG"):
        env.pop(var, None)
    # pytest-xdist on the machine's cores (at most 4: the pipeline tests use two threads each);
    # `dev.py test -n 0` runs in one process
    args = sys.argv[2:]
    workers = (
        [] if any(a.startswith(("-n", "--numprocesses")) for a in args) else ["-n", str(min(4, os.cpu_count() or 1))]
    )
    sh(PY, "-m", "pytest", *workers, *existing_tests(), *args, env=env)
    return 0


def existing_tests() -> list[str]:
    packages = RUNTIME_PACKAGES + PROBE_ONLY_PACKAGES + SERVER_PACKAGES + SDCPP_PACKAGES
    tests = [f"packages/{n}/tests" for n in existing(packages)]
    return ["tests", *tests, "examples/sdkit-onnxruntime/tests", "tools/tests"]


VULKAN_TESTS = ["packages/sdkit-ggml/tests/test_vulkan.py"]
VULKAN_DEST = (
    "import importlib.metadata as m; from sdkit.cache import cache_root; "
    "print(cache_root() / 'ggml-vulkan' / m.version('libggml-python'))"
)


def vulkan_build() -> Path:
    """ggml with its Vulkan backend, built once into the sdkit cache and reused after (a portable
    CPU part, so a cache moved to another CPU still loads). Missing tools are installed with
    apt-get where this runs as root on Debian/Ubuntu (tools/vulkan_sdk.py)."""
    dest = Path(subprocess.run([PY, "-c", VULKAN_DEST], check=True, capture_output=True, text=True).stdout.strip())
    if (dest / "sdkit-native-build.json").is_file():
        print(f"dev.py: reusing the ggml Vulkan build in {dest}", flush=True)
        return dest
    lavapipe = any(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json"))
    tools = all(shutil.which(t) for t in ("cmake", "c++", "glslc"))
    apt = (
        [] if (tools and lavapipe) or os.name == "nt" or os.geteuid() != 0 or not shutil.which("apt-get") else ["--apt"]
    )
    sdk = subprocess.run([PY, "tools/vulkan_sdk.py", *apt], check=True, capture_output=True, text=True, cwd=ROOT)
    prefix = sdk.stdout.strip().splitlines()[-1] if sdk.stdout.strip() else ""
    print(sdk.stdout, end="", flush=True)
    sdk_args = ["--vulkan-sdk", prefix] if prefix else []
    sh(PY, "-m", "sdkit_ggml.runtime.native_build", "--vulkan", "--no-native", "--no-openmp", *sdk_args, "--dest", dest)
    return dest


def vulkan() -> int:
    """The tests marked ``vulkan`` (packages/sdkit-ggml/tests/test_vulkan.py) on ggml's Vulkan
    backend, in both of ggml-vulkan's precision modes: its default (F16 shader tiles where the
    device has F16) and GGML_VK_DISABLE_F16 (F32 tiles: the CPU's bars). ggml-vulkan lists a
    CPU-type device (lavapipe) only when GGML_VK_VISIBLE_DEVICES names it, so it is set to the
    first Vulkan device unless given."""
    ensure_venv()
    install(RUNTIME_PACKAGES, extra=("pytest>=8", "onnxruntime>=1.17"))
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_DISABLE_F16"}
    env["SDKIT_GGML_LIB_DIR"] = str(vulkan_build())
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    # the full-size SD 1.5 VAE graphs (also marked slow) take lavapipe's LLVM many minutes to
    # compile; `python3 dev.py vulkan -m vulkan` runs them too (a later -m wins)
    for label, mode in (("F16 tiles, ggml-vulkan's default", {}), ("F32 tiles", {"GGML_VK_DISABLE_F16": "1"})):
        print(f"dev.py vulkan: {label}", flush=True)
        sh(PY, "-m", "pytest", "-m", "vulkan and not slow", *VULKAN_TESTS, *sys.argv[2:], env={**env, **mode})
    return 0


def sdcpp_wheel(build: bool) -> Path | None:
    """stable-diffusion-cpp-python's wheel, built from its sdist once (CPU, this machine's SIMD, no
    WebP/WebM: the binding does not use them) into the sdkit cache and reused after; None when
    there is none and ``build`` is False."""
    dest = Path(subprocess.run([PY, "-c", SDCPP_DEST], check=True, capture_output=True, text=True).stdout.strip())
    found = sorted(dest.glob("stable_diffusion_cpp_python-*.whl"))
    if found or not build:
        if found:
            print(f"dev.py: reusing the stable-diffusion-cpp-python build in {dest}", flush=True)
        return found[-1] if found else None
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    env.setdefault("CMAKE_ARGS", "-DSD_WEBP=OFF -DSD_WEBM=OFF")
    start = time.perf_counter()
    source_only = ("--no-binary", "stable-diffusion-cpp-python")  # its sdist; the build tools as wheels
    sh(PY, "-m", "pip", "wheel", "-q", "--no-deps", *source_only, "-w", dest, SDCPP_BINDING, env=env)
    print(f"dev.py: built stable-diffusion-cpp-python in {time.perf_counter() - start:.0f} s into {dest}", flush=True)
    return sorted(dest.glob("stable_diffusion_cpp_python-*.whl"))[-1]


def install_sdcpp(build: bool) -> None:
    """sdkit-sdcpp without its dependencies, then its binding from the cache (built if ``build``)."""
    pip_install("--no-deps", *[a for n in existing(SDCPP_PACKAGES) for a in ("-e", f"packages/{n}")])
    wheel = sdcpp_wheel(build)
    if wheel is None:
        print(
            "dev.py: no stable-diffusion-cpp-python build (python3 dev.py sdcpp makes one): its tests skip", flush=True
        )
        return
    pip_install("--no-deps", str(wheel))


def sdcpp() -> int:
    """sdkit-sdcpp's tests with the binding built (once) from its sdist: ~3 min on 2 cores the first
    time. ``python3 dev.py sdcpp -m slow`` runs the full-size no-drift checks (SD 1.5, SDXL)."""
    ensure_venv()
    install(["sdkit-core"], extra=("pytest>=8", "gguf>=0.10"))
    install_sdcpp(build=True)
    sh(PY, "-m", "pytest", "packages/sdkit-sdcpp/tests", *sys.argv[2:])
    return 0


def version() -> str:
    """The shared version, from the meta-distribution's pyproject.toml (no toml parser on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)  # type: ignore[union-attr]


def wheels() -> int:
    """Every first-party wheel (the meta-distribution and each package) into dist/."""
    ensure_venv()
    DIST.mkdir(exist_ok=True)
    packages = RUNTIME_PACKAGES + PROBE_ONLY_PACKAGES + SERVER_PACKAGES + SDCPP_PACKAGES
    sources = [".", *(f"packages/{n}" for n in existing(packages))]
    sh(PY, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", DIST, *sources)
    print(f'wheels in {DIST}: pip install --find-links dist "sdkit[cpu]>={version()}" (README, Install)')
    return 0


def extras() -> int:
    """tools/check_extras.py: each README install line in a fresh venv, from the wheels in dist/."""
    ensure_venv()
    install(["sdkit-core"])
    wheels()
    sh(PY, "tools/check_extras.py", "--dist", DIST, *sys.argv[2:])
    return 0


def main() -> int:
    commands = {"demo": demo, "test": test, "wheels": wheels, "extras": extras, "vulkan": vulkan, "sdcpp": sdcpp}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    try:
        return commands[sys.argv[1]]()
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
