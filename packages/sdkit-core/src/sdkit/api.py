"""The public Python API: ``backends()``, ``devices()``, ``choose_backend()``, ``load_model()``,
``compile()``, ``check()``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdkit.backend import Availability, CompiledModel, SupportReport
from sdkit.cache import cache_root
from sdkit.device import Device
from sdkit.errors import ModelFormatError, SdkitError
from sdkit.isolation import isolated_compile, isolation_wanted, job_for
from sdkit.known_backends import KNOWN_BACKENDS, PIPELINE_ENGINES, plugin_problem, why_missing
from sdkit.limits import check_graph_memory, check_weights, shape_like
from sdkit.loaders import find_loader, loaders_by_priority
from sdkit.model import Model, refuse_unsafe_or_missing, shaped
from sdkit.plugins import get_plugins
from sdkit.selection import Measured, choose, compile_choice, get_backend, probe, requested_precision
from sdkit.timings import TimingsStore

if TYPE_CHECKING:
    from sdkit.tuning import TuneSettings


@dataclass(frozen=True)
class BackendInfo:
    """What ``sdkit.backends()`` reports for one backend: a registered one, or a first-party one
    whose plugin did not load (``installed`` says whether its distribution is there; if not,
    ``install_hint`` is the command that installs it)."""

    name: str
    plugin: str
    available: bool
    reason: str
    install_hint: str
    version: str
    priority: int
    devices: list[str] = field(default_factory=list)
    description: str = ""
    installed: bool = True  # False for a first-party backend whose distribution is not installed
    precisions: list[str] | None = None  # the precisions it declares (None: not declared)


def backends() -> list[BackendInfo]:
    """Every registered backend, available or not, with the reason and devices, then every
    first-party backend whose plugin is missing, with the command that installs it."""
    plugins = get_plugins()
    infos = []
    for name, cls in plugins.backends.items():
        instance = get_backend(name)
        availability = probe(instance)
        devices: list[str] = []
        if availability.ok:
            try:
                devices = [str(d) for d in instance.devices()]
            except Exception as exc:
                availability = type(availability)(False, f"devices() failed: {exc}", availability.install_hint)
        infos.append(
            BackendInfo(
                name=name,
                plugin=plugins.backends.owner(name),
                available=availability.ok,
                reason=availability.reason,
                install_hint=availability.install_hint,
                version=availability.version,
                priority=cls.priority,
                devices=devices,
                description=cls.description,
                precisions=None if cls.precisions is None else list(cls.precisions),
            )
        )
    infos.sort(key=lambda b: (-b.priority, b.name))
    for known in KNOWN_BACKENDS:
        if plugins.backends.get(known.name) is None:
            reason, hint, installed = why_missing(known, plugin_problem(known, plugins.failures, plugins.disabled))
            infos.append(
                BackendInfo(known.name, known.entry_point, False, reason, hint, "", 0, [], known.runs_on, installed)
            )
    return infos


def pipeline_engines() -> list[BackendInfo]:
    """The engines that run whole pipelines rather than graphs (``PipelineLoader.engine``:
    stable-diffusion.cpp), from their loaders' ``probe()`` and ``devices()``, then each first-party
    one whose plugin is missing. Not in ``backends()``: ``compile``, ``check`` and ``tune`` cannot
    use them; ``load_pipeline(path, backend=name)`` does. ``sdkit backends`` lists both."""
    plugins = get_plugins()
    infos, found = [], set()
    for loader in loaders_by_priority("pipeline"):
        engine = getattr(loader, "engine", "")
        if not engine or engine in found:
            continue
        found.add(engine)
        try:
            availability = loader.probe()
            devices = [str(d) for d in loader.devices()] if availability.ok else []
        except Exception as exc:  # a broken binding is an unavailable engine, not a broken listing
            availability, devices = Availability(False, f"probe failed: {exc}"), []
        owner = plugins.loaders.owner(loader.name)
        infos.append(
            BackendInfo(
                engine, owner, availability.ok, availability.reason, availability.install_hint,
                availability.version, 0, devices, getattr(loader, "description", ""),
            )
        )  # fmt: skip
    for known in PIPELINE_ENGINES:
        if known.name not in found:
            reason, hint, installed = why_missing(known, plugin_problem(known, plugins.failures, plugins.disabled))
            infos.append(
                BackendInfo(known.name, known.entry_point, False, reason, hint, "", 0, [], known.runs_on, installed)
            )
    return infos


def devices() -> dict[str, list[Device]]:
    """The devices of every available backend, by backend name (in ``backends()`` order), then
    those of the pipeline engines (``pipeline_engines()``)."""
    found: dict[str, list[Device]] = {}
    for info in backends():
        if info.available:
            found[info.name] = get_backend(info.name).devices()
    for info in pipeline_engines():
        if info.available:
            found[info.name] = [Device.parse(d) for d in info.devices]
    return found


@dataclass(frozen=True)
class BackendChoice:
    """What ``choose_backend()`` answers: the backend and device a compile would use, why
    (``reason``: explicit, preferred, measured fastest with its median and where it was measured,
    or priority), and each backend passed over with the reason (automatic choice only): it could
    not run here, or stored timings (``sdkit tune``) measured it slower or wrong."""

    backend: str
    device: Device
    rejected: tuple[tuple[str, str], ...] = ()
    reason: str = ""


def choose_backend(
    model: Model | str | os.PathLike[str] | None = None,
    backend: str = "auto",
    device: str | Device | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    **options: Any,
) -> BackendChoice:
    """The backend ``sdkit.compile(model, backend, device, input_shapes, **options)`` would use,
    without compiling (stored timings for those shapes and options count, as in ``compile``).

    Without a model, the automatic choice skips the ``check()`` step (any model). Raises what
    ``compile`` would: ``NoBackendError`` (listing every candidate and why), ``UnknownBackendError``,
    ``BackendUnavailableError``, ``DeviceError``.
    """
    measured: Measured | None = None
    graph = None
    if model is not None:
        loaded = as_model(model)
        graph = shaped(loaded.graph, input_shapes)
        if backend == "auto" and timings_stored():
            from sdkit.tuning import stored_measured  # only where a tune stored timings (as in compile)

            measured = stored_measured(loaded, graph, device, options)
    choice = choose(graph, backend, device, measured, requested_precision(options))
    return BackendChoice(choice.backend.name, choice.device, tuple(choice.rejected), choice.reason)


def load_model(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """Load a model with the first registered loader whose ``sniff`` accepts ``path``."""
    path = Path(path)
    refuse_unsafe_or_missing(path, "model")
    loader = find_loader(path)
    if loader is None:
        names = ", ".join(get_plugins().loaders.names())
        raise ModelFormatError(f"no model loader recognises {path} (loaders: {names})")
    return loader.load(path, **kwargs)


def as_model(model: Model | str | os.PathLike[str]) -> Model:
    """A single-graph Model from a Model or an .onnx path (a pipeline folder is refused)."""
    if isinstance(model, Model):
        return model
    if Path(model).is_dir():  # refuse before a loader compiles a whole pipeline
        raise ModelFormatError(
            f"{model} is a folder: single-model commands take an .onnx file "
            "(for a pipeline folder use sdkit.load_pipeline or `sdkit generate`)"
        )
    loaded = load_model(model)
    if not isinstance(loaded, Model):
        raise SdkitError(f"{model} is not a single-graph model; use sdkit.load_pipeline")
    return loaded


def compile(  # noqa: A001 - the public name the contract gives
    model: Model | str | os.PathLike[str],
    backend: str = "auto",
    device: str | Device | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    tune: bool | TuneSettings = False,
    **options: Any,
) -> CompiledModel:
    """Compile ``model`` for a backend (``"auto"`` chooses) and device.

    ``input_shapes`` fixes symbolic input dims before compiling; without it, backends
    that need static shapes compile per call signature. Options: ``precision``
    (fp32|fp16|bf16|q8_0|fp8, q8_0 on ggml only, fp8 on tensorrt only), ``threads``, ``cache``, ``isolate`` (compile and
    first runs tried in a child process first, see ``sdkit.isolation``; default
    ``SDKIT_ISOLATE``), plus the backend's own keys.

    With ``backend="auto"``, timings a tune (``sdkit tune``) stored for this graph, shapes,
    device, options and machine make the measured fastest backend the choice (after a
    preference); without any, the priority order decides. ``tune=True`` (or ``TuneSettings``)
    measures them first where none are stored (``sdkit.tuning``): now, at ``input_shapes`` or
    the graph's own fixed shapes, or, when some input dim is still symbolic, at each input
    signature's first run, with its real inputs. A symbolic model a tune stored timings for
    also chooses per signature at its first run. An explicit ``backend`` is never tuned, and a
    tune's own compiles are not isolated (it compiles each backend in this process).
    """
    model = as_model(model)
    graph = shaped(model.graph, input_shapes)
    check_graph_memory(graph.proto, shape_like(graph.proto, model.weights))  # before any backend allocates
    check_weights(model.weights.nbytes, len(model.weights))  # before a backend (or a child) maps them
    isolate = isolation_wanted(options.pop("isolate", None))
    measured: Measured | None = None
    if backend == "auto" and (tune or timings_stored()):
        # Only where tuning applies are sdkit.tuned, .tuning and .trials imported (downwards, at
        # the first such compile): a plain compile neither loads nor walks through them.
        from sdkit.tuned import auto_compile

        tuned = auto_compile(model, graph, input_shapes, device, options, tune)
        if isinstance(tuned, CompiledModel):
            return tuned
        measured = tuned
    choice = choose(graph, backend, device, measured, requested_precision(options))
    if not isolate:
        return compile_choice(choice, graph, model.weights, options)
    job = job_for(graph.proto, model.weights, choice.backend.name, choice.device, options)
    return isolated_compile(lambda: compile_choice(choice, graph, model.weights, options), job, choice.backend.name)


def timings_stored() -> bool:
    """Whether any tune stored timings in this cache (then ``auto`` consults them)."""
    return TimingsStore(cache_root()).folder.is_dir()


def check(model: Model | str | os.PathLike[str], backend: str = "auto") -> dict[str, SupportReport]:
    """``check()`` of one backend, or of every available backend with ``"auto"``."""
    model = as_model(model)
    names = [backend] if backend != "auto" else [b.name for b in backends() if b.available]
    return {name: get_backend(name).check(model.graph) for name in names}
