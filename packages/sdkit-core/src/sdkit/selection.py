"""Backend choice: explicit > SDKIT_BACKEND / config preference > measured fastest (stored
timings, ``sdkit tune``) > priority, among the backends that offer the precision asked for
(``Backend.precisions``), whose probe succeeds, that have the device and whose check is
clean. Registration never decides; pluggy's call order plays no part."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.config import backend_preference
from sdkit.device import Device
from sdkit.errors import (
    BackendUnavailableError,
    DeviceError,
    NoBackendError,
    OptionError,
    SdkitError,
    UnknownBackendError,
)
from sdkit.known_backends import known_backend, known_names, pipeline_engine, plugin_problem, unavailable
from sdkit.limits import check_weights
from sdkit.model import Graph, WeightSet
from sdkit.options import PRECISIONS, make_options
from sdkit.plugins import get_plugins


def split_candidate(name: str) -> tuple[str, str | None]:
    """``"ggml@cuda:0"`` -> ``("ggml", "cuda:0")``, ``"ggml"`` -> ``("ggml", None)``: a tune may
    measure one backend on each of its devices, and the automatic choice then takes the device
    with the backend."""
    backend, _, device = name.partition("@")
    return backend, device or None


def get_backend(name: str) -> Backend:
    """The instance of a registered backend, by name (one per plugin set: ``reset_plugins()``
    forgets it); a candidate's ``@device`` is ignored."""
    name = split_candidate(name)[0]
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
    engine = pipeline_engine(name)
    if engine is not None:  # stable-diffusion.cpp runs whole pipelines, never one graph
        return OptionError(
            f"{engine.name!r} ({engine.runs_on}) runs whole pipelines, not single graphs or components: "
            f"sdkit.load_pipeline(path, backend={engine.name!r}) or sdkit generate --backend {engine.name}"
        )
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
    reason: str = ""  # why this backend: explicit, preferred, measured fastest, priority
    name: str = ""  # the candidate chosen: the backend's name, or "name@device" as a tune measured it


@dataclass(frozen=True)
class Measured:
    """Stored timings of one model at its shapes, as the automatic choice uses them (made from
    ``sdkit.timings`` by ``sdkit.tuning``): the median seconds of each backend (or ``backend@device``,
    ``split_candidate``) that ran and agreed
    with the first backend, why each other measured backend is out, and where the numbers come
    from (said in the reasons)."""

    medians: Mapping[str, float]
    failed: Mapping[str, str] = field(default_factory=dict)
    source: str = ""


def fallback(backend: Backend | type[Backend]) -> bool:
    """Priority 0 marks a fallback (the reference backend): exact and slow, measured as the
    baseline of a tune but never chosen for speed."""
    return backend.priority <= 0


def candidates(measured: Measured | None = None) -> list[str]:
    """Every registered backend: preferred ones first, then the measured ones fastest first
    (fallbacks and those that failed their measurement left out), then the rest by priority."""
    registry = get_plugins().backends
    preferred = [p for p in backend_preference() if p.lower() != "auto"]
    for name in preferred:
        if registry.get(name) is None and known_backend(name) is None:
            raise _not_registered(name)
    preferred = [registry.resolve(p) or p for p in preferred]
    classes = dict(registry.items())
    rest = sorted((n for n in classes if n not in preferred), key=lambda n: (-classes[n].priority, n))
    if measured is None:
        return preferred + rest

    def timed_here(n: str) -> bool:  # a measured candidate of a registered, non-fallback backend
        backend = split_candidate(n)[0]
        return backend in classes and backend not in preferred and not fallback(classes[backend])

    fastest = sorted((n for n in measured.medians if timed_here(n)), key=lambda n: measured.medians[n])
    per_device = {split_candidate(n)[0] for n in [*measured.medians, *measured.failed] if "@" in n}
    tail = [n for n in rest if n not in fastest and n not in measured.failed and n not in per_device]
    return preferred + fastest + tail


def requested_precision(options: Mapping[str, Any]) -> str | None:
    """The precision compile options ask for, where it is one sdkit knows (an unknown one is
    left to the options' own validation, which names the valid ones)."""
    precision = options.get("precision")
    return precision if isinstance(precision, str) and precision in PRECISIONS else None


def offers(backend: Backend | type[Backend], precision: str | None) -> bool:
    """Whether ``backend`` declares ``precision`` (one that declares nothing offers every one)."""
    return precision is None or backend.precisions is None or precision in backend.precisions


def _offered(backend: Backend | type[Backend]) -> str:
    return ", ".join(backend.precisions) if backend.precisions is not None else "any (not declared)"


def check_precision_offered(precision: str | None) -> None:
    """``OptionError`` when no registered backend offers ``precision``, naming what each offers:
    the automatic choice would otherwise fail backend by backend."""
    classes = dict(get_plugins().backends.items())
    if precision is None or not classes or any(offers(cls, precision) for cls in classes.values()):
        return
    each = "; ".join(f"{name}: {_offered(cls)}" for name, cls in sorted(classes.items()))
    raise OptionError(f"no installed backend offers precision {precision!r} ({each})")


def qualify(
    name: str, graph: Graph | None, device: str | Device | None, precision: str | None = None
) -> tuple[Choice | None, str]:
    """``(Choice, "")`` when backend ``name`` is installed, offers ``precision``, its probe
    succeeds, it has the device and (given a graph) its ``check()`` is clean; else
    ``(None, why not)``. ``name`` may pin a device (``"ggml@cuda:0"``, as a tune measured it)."""
    pinned = split_candidate(name)[1]
    if pinned is not None:
        if device is not None and not Device.parse(device).matches(Device.parse(pinned)):
            return None, f"measured on {pinned}, not on the device asked for ({device})"
        device = pinned
    try:
        candidate = get_backend(name)
    except BackendUnavailableError as exc:  # preferred, but its plugin is not installed
        return None, f"{exc.reason} ({exc.install_hint})" if exc.install_hint else exc.reason
    if not offers(candidate, precision):
        return None, f"does not offer precision {precision!r} (it offers {_offered(candidate)})"
    availability = probe(candidate)
    if not availability.ok:
        return None, availability.reason or "unavailable"
    try:
        picked = pick_device(candidate, device)
    except DeviceError as exc:
        return None, str(exc)
    report = None
    if graph is not None:
        try:
            report = candidate.check(graph)
        except Exception as exc:
            return None, f"check failed: {exc}"
        if not report.ok:
            return None, report.summary()
    return Choice(candidate, picked, report, name=name), ""


def choose(
    graph: Graph | None,
    backend: str = "auto",
    device: str | Device | None = None,
    measured: Measured | None = None,
    precision: str | None = None,
) -> Choice:
    """Pick the backend and device to compile ``graph`` with: explicit > preference > measured
    fastest (``measured``: stored timings for this graph, shapes, device and options) > priority.
    ``precision`` (auto only): backends that do not offer it are passed over; an explicit
    backend is taken as asked, its compile refusing a precision it cannot run."""
    if backend != "auto":
        chosen = get_backend(backend)
        availability = probe(chosen)
        if not availability.ok:
            raise BackendUnavailableError(chosen.name, availability.reason, availability.install_hint)
        return Choice(chosen, pick_device(chosen, device), reason="explicit")
    check_precision_offered(precision)
    preferred = {get_plugins().backends.resolve(p) or p for p in backend_preference()}
    rejected: list[tuple[str, str]] = []
    if measured is not None:
        rejected += [(n, f"{why} ({measured.source})") for n, why in measured.failed.items() if n not in preferred]
    for name in candidates(measured):
        choice, why = qualify(name, graph, device, precision)
        if choice is None:
            rejected.append((name, why))
            continue
        choice.reason = _reason(name, preferred, measured)
        passed = [] if measured is None or name in preferred else _passed_over(name, measured, {r for r, _ in rejected})
        choice.rejected = rejected + passed
        return choice
    raise NoBackendError(rejected)


def _reason(name: str, preferred: set[str], measured: Measured | None) -> str:
    if name in preferred:
        return "preferred (SDKIT_BACKEND or the config's backend_preference)"
    if measured is not None and name in measured.medians and not fallback(get_backend(name)):
        return f"measured fastest: {measured.medians[name]:.4g} s median ({measured.source})"
    return f"priority {get_backend(name).priority}" + (" (not measured)" if measured is not None else "")


def _passed_over(name: str, measured: Measured, already: set[str]) -> list[tuple[str, str]]:
    """Why each other measured backend lost to ``name``: slower, or a fallback."""
    mine = measured.medians.get(name)
    result = []
    for other, median in sorted(measured.medians.items(), key=lambda item: item[1]):
        if other == name or other in already:
            continue
        cls = get_plugins().backends.get(split_candidate(other)[0])
        if cls is not None and fallback(cls):
            result.append((other, f"a fallback, never chosen for speed (measured {median:.4g} s median)"))
        elif mine is not None:
            result.append((other, f"measured slower: {median:.4g} s median, {median / mine:.2f}x {name}'s"))
        else:
            result.append((other, f"measured {median:.4g} s median, but {name} came first"))
    return result


def compile_choice(choice: Choice, graph: Graph, weights: WeightSet, options: Mapping[str, Any]) -> CompiledModel:
    """``choice.backend.compile`` with validated options; the result knows its backend's name.
    Weights over the memory budget are refused before the backend sees them."""
    opts = make_options(options, choice.backend.extra_options)
    check_weights(weights.nbytes, len(weights))
    compiled = choice.backend.compile(graph, weights, choice.device, opts)
    compiled.backend_name = choice.backend.name
    return compiled
