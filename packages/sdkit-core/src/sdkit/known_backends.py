"""The first-party backends, installed or not, and the command that installs each.

Core knows these by name so that ``sdkit backends`` lists every one of them on every machine,
and so that asking for one whose plugin is missing says what to install
(``BackendUnavailableError``) instead of "unknown backend". Third-party backends are not listed
here: they exist only once their plugin is installed.

The install commands carry a version floor because sdkit 3 is a pre-release (3.0.0.dev0) while
PyPI's newest *final* ``sdkit`` is 2.1.1: without ``>=3.0.0.dev0`` pip never picks a
pre-release and installs sdkit 2. Once 3.0.0 is out a bare ``"sdkit[cpu]"`` picks it as well;
the floor (this core's version, so then ``>=3.0.0``) only keeps sdkit 2 out.

A hint must work where it is printed, and sdkit 3 is not on PyPI yet: ``install_command`` writes
it for how this sdkit-core was installed (``install_source``, from the installer's
``direct_url.json``, PEP 610; no network): editable from a checkout, ``pip install -e`` of the
package's folder there; from a wheel file, ``--find-links`` that wheel's folder; a dev release
of unknown origin (never published), the checkout's ``python3 dev.py wheels`` first; else PyPI.
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from sdkit._version import __version__
from sdkit.errors import BackendUnavailableError


@dataclass(frozen=True)
class KnownBackend:
    """A first-party backend: its name, the distribution that provides it and the extra of the
    ``sdkit`` meta-distribution that installs that distribution."""

    name: str
    distribution: str
    extra: str
    runs_on: str
    aliases: tuple[str, ...] = ()
    platforms: str = ""  # a note where the extra installs nothing elsewhere (Core ML: macOS)

    @property
    def entry_point(self) -> str:
        """The plugin's entry-point name: the distribution name without ``sdkit-``."""
        return self.distribution.removeprefix("sdkit-")

    @property
    def install_command(self) -> str:
        note = f" (on {self.platforms})" if self.platforms else ""
        return install_command(self.extra) + note


# In the order of the plugins' priorities, which is how ``sdkit backends`` lists them.
KNOWN_BACKENDS: tuple[KnownBackend, ...] = (
    KnownBackend("tensorrt", "sdkit-trt", "nvidia", "NVIDIA GPUs (TensorRT-RTX, TensorRT)", ("trt",)),
    KnownBackend("migraphx", "sdkit-migraphx", "amd", "AMD GPUs (ROCm MIGraphX)"),
    KnownBackend("coreml", "sdkit-coreml", "apple", "Apple Neural Engine and GPU", platforms="macOS"),
    KnownBackend("openvino", "sdkit-openvino", "intel", "Intel/AMD CPUs, Intel GPUs and NPUs"),
    KnownBackend("ggml", "sdkit-ggml", "cpu", "CPU; CUDA, Vulkan, Metal with a ggml built for them"),
    KnownBackend("reference", "sdkit-core", "", "CPU (numpy onnx.reference): exact, slow"),
)
# First-party engines that run whole pipelines, not graphs: a pipeline loader registered with
# ``engine = name`` (``sdkit.pipelines.PipelineLoader``) takes ``load_pipeline(path, backend=name)``.
PIPELINE_ENGINES: tuple[KnownBackend, ...] = (
    KnownBackend("sdcpp", "sdkit-sdcpp", "sdcpp", "stable-diffusion.cpp: .gguf and single files, whole pipelines"),
)


def requirement(extra: str = "", package: str = "sdkit") -> str:
    """The quoted pip requirement for ``package`` with ``extra``, e.g. ``"sdkit[cpu]>=3.0.0.dev0"``.

    The floor is this core's own version: a plugin installed with it pins a core at least as new."""
    name = f"{package}[{extra}]" if extra else package
    return f'"{name}>={__version__}"'


# Extras of the meta-distribution beyond the backends', as (distribution, its own extra).
_OTHER_EXTRAS = {"serve": ("sdkit-serve", ""), "ray": ("sdkit-serve", "ray"), "sdcpp": ("sdkit-sdcpp", "")}
# Subcommands of ``sdkit`` that another distribution adds, and the extra that installs it.
EXTRA_COMMANDS = {"serve": "serve"}


@dataclass(frozen=True)
class InstallSource:
    """How sdkit-core was installed. ``kind``: "index" (PyPI or another index), "checkout" (a
    folder of the repo; ``location`` its root), "wheels" (a wheel file; ``location`` its folder)
    or "unpublished" (a dev release from an unknown place: no index has it)."""

    kind: str
    location: str = ""
    editable: bool = False


def _direct_url(distribution: str) -> dict[str, object]:
    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
        found = json.loads(text) if text else {}
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def install_source(distribution: str = "sdkit-core") -> InstallSource:
    """How ``distribution`` was installed, from what the installer recorded (PEP 610)."""
    info = _direct_url(distribution)
    url = str(info.get("url", ""))
    if url.startswith("file://"):
        path = Path(unquote(urlparse(url).path))
        dir_info = info.get("dir_info")
        if isinstance(dir_info, dict) and (path.parent.parent / "packages" / path.name).is_dir():
            return InstallSource("checkout", str(path.parent.parent), bool(dir_info.get("editable")))
        if path.suffix == ".whl":
            return InstallSource("wheels", str(path.parent))
    version = installed_version(distribution) or __version__
    return InstallSource("unpublished" if ".dev" in version else "index")


def install_command(extra: str = "", package: str = "sdkit", source: InstallSource | None = None) -> str:
    """The command that installs ``package`` (the meta-distribution ``sdkit`` or one of ours)
    with ``extra``, written for how this sdkit was installed (``install_source``)."""
    source = source or install_source()
    if source.kind == "checkout":
        if package == "sdkit":
            by_extra = {k.extra: (k.distribution, "") for k in KNOWN_BACKENDS}
            package, extra = {**by_extra, **_OTHER_EXTRAS}.get(extra, ("sdkit-core", extra))
        target = str(Path(source.location) / "packages" / package) + (f"[{extra}]" if extra else "")
        return f'pip install {"-e " if source.editable else ""}"{target}"'
    spec = requirement(extra, package)
    if source.kind == "wheels":
        return f"pip install --find-links {shlex.quote(source.location)} {spec}"
    if source.kind == "unpublished":
        return f"python3 dev.py wheels && pip install --find-links dist {spec} (in the sdkit checkout)"
    return f"pip install {spec}"


def known_backend(name: str) -> KnownBackend | None:
    """The first-party backend called ``name`` (or one of its aliases), case-insensitive."""
    wanted = name.strip().lower()
    for known in KNOWN_BACKENDS:
        if wanted == known.name or wanted in known.aliases:
            return known
    return None


def pipeline_engine(name: str) -> KnownBackend | None:
    """The first-party pipeline engine called ``name`` (``sdcpp``), case-insensitive."""
    wanted = name.strip().lower()
    return next((known for known in PIPELINE_ENGINES if known.name == wanted), None)


def known_names() -> list[str]:
    return [k.name for k in KNOWN_BACKENDS]


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class _Failure(Protocol):
    @property
    def distribution(self) -> str: ...
    @property
    def stage(self) -> str: ...
    @property
    def error(self) -> str: ...


def plugin_problem(known: KnownBackend, failures: Iterable[_Failure], disabled: Sequence[str]) -> str:
    """What went wrong with the plugin of ``known`` in this process, if the loader recorded it."""
    if known.entry_point in disabled:
        return "its plugin is disabled by SDKIT_DISABLE_PLUGINS"
    for failure in failures:
        if failure.distribution == known.distribution:
            return f"its plugin failed to {failure.stage}: {failure.error}"
    return ""


def why_missing(known: KnownBackend, problem: str = "") -> tuple[str, str, bool]:
    """(reason, install hint, whether its distribution is installed) for a known backend that
    no loaded plugin registered. ``problem`` is what ``plugin_problem`` found, if anything."""
    version = installed_version(known.distribution)
    if version is None:
        return f"plugin {known.distribution} is not installed", known.install_command, False
    if problem:
        return f"{known.distribution} {version} is installed but {problem}", "", True
    return f"{known.distribution} {version} is installed but registered no {known.name!r} backend", "", True


def unavailable(known: KnownBackend, problem: str = "") -> BackendUnavailableError:
    """The error for asking for a known backend whose plugin is not loaded."""
    reason, hint, _ = why_missing(known, problem)
    return BackendUnavailableError(known.name, reason, hint)
