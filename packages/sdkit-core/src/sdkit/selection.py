"""Backend choice: explicit > SDKIT_BACKEND / config preference > probe ok and check clean
> priority. Registration never decides; pluggy's call order plays no part."""

from __future__ import annotations

from dataclasses import dataclass, field

from sdkit.backend import Availability, Backend, SupportReport
from sdkit.config import backend_preference
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, DeviceError, NoBackendError, SdkitError, UnknownBackendError
from sdkit.known_backends import known_backend, known_names, plugin_problem, unavailable
from sdkit.model import Graph
from sdkit.plugins import get_plugins


def get_backend(name: str) -> Backend:
    """The instance of a registered backend, by name (one per plugin set: ``reset_plugins()``
    forgets it)."""
    plugins = get_plugins()
    cls = plugins.backends.get(name)
    if cls is None:
        raise _not_registered(name)
    instances = plugins.backend_instances
    if cls.name not in instances or type(instances[cls.name]) is not cls:
        instances[cls.name] = cls()
    return instances[cls.name]


def _not_registered(name: str) -> SdkitError:
    """A first-party backend whose plugin is missing says what to install; any other name is
    unknown (with a did-you-mean over everything registered or first-party)."""
    plugins = get_plugins()
    known = known_backend(name)
    if known is not None:
        return unavailable(known, plugin_problem(known, plugins.failures, plugins.disabled))
    return UnknownBackendError(name, {*plugins.backends.names(), *known_names()})


def probe(backend: Backend) -> Availability:
    """``backend.probe()`` once per plugin set; an exception in a probe is an unavailable backend."""
    probes = get_plugins().probes
    if backend.name not in probes:
        try:
            probes[backend.name] = backend.probe()
        except Exception as exc:
            probes[backend.name] = Availability(False, f"probe failed: {type(exc).__name__}: {exc}")
    return probes[backend.name]


def pick_device(backend: Backend, device: str | Device | None) -> Device:
    """The requested device if the backend has it, else its first device."""
    devices = backend.devices()
    if device is None:
        if not devices:
            raise DeviceError(f"backend {backend.name!r} lists no devices")
        return devices[0]
    wanted = Device.parse(device)
    for have in devices:
        if wanted.matches(have):
            return have
    listed = ", ".join(str(d) for d in devices) or "none"
    raise DeviceError(f"backend {backend.name!r} has no device {wanted}; its devices: {listed}")


@dataclass
class Choice:
    backend: Backend
    device: Device
    report: SupportReport | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)


def candidates() -> list[str]:
    """Every registered backend: preferred ones first, then by priority (high first)."""
    registry = get_plugins().backends
    preferred = [p for p in backend_preference() if p.lower() != "auto"]
    for name in preferred:
        if registry.get(name) is None and known_backend(name) is None:
            raise _not_registered(name)
    preferred = [registry.resolve(p) or p for p in preferred]
    priority = {name: cls.priority for name, cls in registry.items()}
    rest = sorted((n for n in priority if n not in preferred), key=lambda n: (-priority[n], n))
    return preferred + rest


def choose(graph: Graph | None, backend: str = "auto", device: str | Device | None = None) -> Choice:
    """Pick the backend and device to compile ``graph`` with."""
    if backend != "auto":
        chosen = get_backend(backend)
        availability = probe(chosen)
        if not availability.ok:
            raise BackendUnavailableError(chosen.name, availability.reason, availability.install_hint)
        return Choice(chosen, pick_device(chosen, device))
    rejected: list[tuple[str, str]] = []
    for name in candidates():
        try:
            candidate = get_backend(name)
        except BackendUnavailableError as exc:  # preferred, but its plugin is not installed
            rejected.append((name, f"{exc.reason} ({exc.install_hint})" if exc.install_hint else exc.reason))
            continue
        availability = probe(candidate)
        if not availability.ok:
            rejected.append((name, availability.reason or "unavailable"))
            continue
        try:
            picked = pick_device(candidate, device)
        except DeviceError as exc:
            rejected.append((name, str(exc)))
            continue
        report = None
        if graph is not None:
            try:
                report = candidate.check(graph)
            except Exception as exc:
                rejected.append((name, f"check failed: {exc}"))
                continue
            if not report.ok:
                rejected.append((name, report.summary()))
                continue
        return Choice(candidate, picked, report, rejected)
    raise NoBackendError(rejected)
