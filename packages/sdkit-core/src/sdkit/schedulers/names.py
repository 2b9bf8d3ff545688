"""Name resolution ("DPM++ 2M Karras" -> ("dpmpp_2m", "karras")) and scheduler creation.

Sampler names come from the plugin registry (built-ins and third parties alike), so a
plugin's aliases resolve with the same forgiving rules: case, spaces, hyphens and "++"
are normalised, and A1111's "k_" prefix is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sdkit.errors import OptionError, UnknownSchedulerError
from sdkit.plugins import SchedulerRegistry, get_plugins
from sdkit.schedulers.base import PREDICTION_TYPES, SCHEDULES, Scheduler

# One row per schedule: canonical name -> (the label A1111 writes in an image's "Schedule type:"
# field, the other names A1111 / ComfyUI / stable-diffusion.cpp users type for it). Names are
# matched after ``normalize``; a new schedule is one row here plus its code.
SCHEDULE_TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    # "discrete" is stable-diffusion.cpp's --scheduler name, "automatic" A1111's sampler default
    "normal": ("Automatic", ("uniform", "default", "discrete", "automatic")),
    "karras": ("Karras", ()),
    "exponential": ("Exponential", ()),
    "sgm_uniform": ("SGM Uniform", ("sgm", "trailing")),
    "simple": ("Simple", ()),
    "ddim_uniform": ("DDIM", ("ddim",)),  # A1111's "DDIM" schedule type (its name "ddim")
    "beta": ("Beta", ()),
    # A1111 picks the SDXL table for SDXL models; so does sdkit's SDXL pipeline.
    "align_your_steps": ("Align Your Steps", ("ays", "ays_sd15", "align_your_steps_sd15")),
    "align_your_steps_sdxl": ("Align Your Steps", ("ays_sdxl",)),
    "align_your_steps_svd": ("Align Your Steps", ("ays_svd",)),
    "kl_optimal": ("KL Optimal", ()),
    "linear_quadratic": ("Linear Quadratic", ()),
}
# Names of other tools that pick a sampler and a schedule at once -> (sampler, schedule).
SAMPLER_SHORTHANDS: dict[str, tuple[str, str]] = {
    "ddim_trailing": ("ddim", "sgm_uniform"),  # stable-diffusion.cpp's --sampling-method
}
# Normalised schedule name or alias -> canonical schedule.
SCHEDULE_ALIASES: dict[str, str] = {
    name: canonical for canonical, (_, aliases) in SCHEDULE_TABLE.items() for name in (canonical, *aliases)
}
# What A1111 writes in an image's "Schedule type:" field for each schedule.
SCHEDULE_LABELS: dict[str, str] = {canonical: label for canonical, (label, _) in SCHEDULE_TABLE.items()}


def normalize(name: str) -> str:
    """Lower-case, "++" -> "pp", separators -> "_": "DPM++ 2M SDE" -> "dpmpp_2m_sde"."""
    text = name.strip().lower().replace("++", "pp")
    text = re.sub(r"[\s\-./]+", "_", text)
    text = re.sub(r"^dpmpp(?=\d)", "dpmpp_", text)  # stable-diffusion.cpp's "dpm++2m"
    return re.sub(r"_+", "_", text).strip("_")


def _registry(registry: SchedulerRegistry | None) -> SchedulerRegistry:
    return registry if registry is not None else get_plugins().schedulers


def _sampler_table(registry: SchedulerRegistry) -> dict[str, str]:
    """Normalised name or alias -> canonical name."""
    table: dict[str, str] = {}
    for canonical, _cls in registry.items():
        table.setdefault(normalize(canonical), canonical)
    for alias, canonical in registry.aliases().items():
        table.setdefault(normalize(alias), canonical)
    return table


def _known_names(registry: SchedulerRegistry) -> list[str]:
    return [*registry.names(), *registry.aliases()]


def _lookup_sampler(key: str, table: dict[str, str]) -> str | None:
    if key in table:
        return table[key]
    if key.startswith("k_") and key[2:] in table:
        return table[key[2:]]
    return None


def resolve_schedule(schedule: str) -> str:
    """Canonical schedule name, or UnknownSchedulerError with a suggestion."""
    canonical = SCHEDULE_ALIASES.get(normalize(schedule)) if isinstance(schedule, str) else None
    if canonical is None:
        raise UnknownSchedulerError(str(schedule), SCHEDULES, kind="schedule")
    return canonical


def resolve(sampler: str, schedule: str | None = None, registry: SchedulerRegistry | None = None) -> tuple[str, str]:
    """(canonical sampler, canonical schedule) for what a user typed.

    ``resolve("DPM++ 2M Karras") == ("dpmpp_2m", "karras")``. Without a suffix the schedule
    is ``schedule`` or "normal"; a suffix that contradicts an explicit ``schedule`` is an
    OptionError. A sampler that lacks the schedule gives way to its ``schedule_variant_of``
    class that has it: ``resolve("DDIM Karras") == ("ddim_sigmas", "karras")`` (ComfyUI's ddim).
    """
    if not isinstance(sampler, str) or not sampler.strip():
        raise UnknownSchedulerError(str(sampler), _known_names(_registry(registry)))
    reg = _registry(registry)
    table = _sampler_table(reg)
    key = normalize(sampler)
    canonical = _lookup_sampler(key, table)
    suffix_schedule: str | None = None
    if canonical is None and key in SAMPLER_SHORTHANDS and SAMPLER_SHORTHANDS[key][0] in table.values():
        canonical, suffix_schedule = SAMPLER_SHORTHANDS[key]
    if canonical is None:
        # "DPM++ 2M Karras", "dpmpp_2m_sde_exponential", "Euler SGM Uniform"...
        for alias in sorted(SCHEDULE_ALIASES, key=len, reverse=True):
            if key.endswith("_" + alias):
                canonical = _lookup_sampler(key[: -len(alias) - 1], table)
                if canonical is not None:
                    suffix_schedule = SCHEDULE_ALIASES[alias]
                    break
    if canonical is None:
        raise UnknownSchedulerError(sampler, _known_names(reg))
    if schedule is None:
        chosen = suffix_schedule or "normal"
        return _schedule_variant(canonical, chosen, reg), chosen
    explicit = resolve_schedule(schedule)
    if suffix_schedule is not None and suffix_schedule != explicit:
        raise OptionError(f"{sampler!r} names schedule {suffix_schedule!r} but schedule={schedule!r} was given")
    return _schedule_variant(canonical, explicit, reg), explicit


def _schedule_variant(canonical: str, schedule: str, registry: SchedulerRegistry) -> str:
    """The sampler that runs ``canonical`` on ``schedule``: itself if it takes the schedule, else
    a registered class whose ``schedule_variant_of`` it is and that does ("ddim" on "karras" is
    ``ddim_sigmas``, ComfyUI's ddim); else itself (its constructor names the schedules it takes)."""
    cls = registry.get(canonical)
    if cls is None or schedule in cls.schedules:
        return canonical
    for name, other in registry.items():
        if getattr(other, "schedule_variant_of", "") == canonical and schedule in other.schedules:
            return name
    return canonical


def sampler_listing(registry: SchedulerRegistry | None = None) -> str:
    """The samplers (each with the other names it answers to) and schedules, one a line, for
    ``sdkit generate --list-samplers`` and its ``--help``."""
    reg = _registry(registry)
    names: dict[str, list[str]] = {name: [] for name in reg.names()}
    for alias, canonical in reg.aliases().items():
        names.setdefault(canonical, []).append(alias)
    lines = ["samplers (any name on a line; a schedule may follow, as in 'DPM++ 2M Karras'):"]
    for name, aliases in names.items():
        cls = reg.get(name)
        base = getattr(cls, "schedule_variant_of", "") if cls is not None else ""
        label = sampler_label(name, reg)
        note = [f"{base} on the schedules {base!r} itself lacks (as in '{label} Karras')"] if base else []
        shown = aliases or note  # "ddim_sigmas": what "DDIM Karras" runs
        lines.append(f"  {name}: {', '.join(shown)}" if shown else f"  {name}")
    lines += [
        f"  {short}: {sampler} with schedule {schedule}" for short, (sampler, schedule) in SAMPLER_SHORTHANDS.items()
    ]
    schedules: dict[str, list[str]] = {name: [] for name in SCHEDULES}
    for alias, canonical in SCHEDULE_ALIASES.items():
        if alias != canonical:
            schedules.setdefault(canonical, []).append(alias)
    lines.append("schedules (--schedule):")
    lines += [f"  {name}: {', '.join(a)}" if a else f"  {name}" for name, a in schedules.items()]
    return "\n".join(lines)


def scheduler_names(registry: SchedulerRegistry | None = None) -> list[str]:
    """Canonical names of every registered scheduler (built-in first, then plugins')."""
    return _registry(registry).names()


def scheduler_class(
    name: str, registry: SchedulerRegistry | None = None, prediction_type: str | None = None
) -> type[Scheduler]:
    """The registered class for a sampler name or alias.

    With ``prediction_type``, the class that runs such models: a sampler whose class does not
    take it is replaced by its registered variant (``variant_of``), so "Euler" on a flow model
    (``prediction_type="flow"``) is ``euler_flow``. None of either is an OptionError naming
    the samplers that do.
    """
    reg = _registry(registry)
    canonical, _ = resolve(name, registry=reg)
    cls = reg.get(canonical)
    assert cls is not None  # resolve() only returns registered names
    if prediction_type is None or prediction_type in cls.prediction_types:
        return cls
    takes = {n: c for n, c in reg.items() if prediction_type in getattr(c, "prediction_types", ())}
    # "DDIM Karras" resolves to ddim_sigmas (its schedule_variant_of is ddim): ddim's variant runs it
    wanted = {canonical, str(getattr(cls, "schedule_variant_of", "") or canonical)}
    for other in takes.values():
        if getattr(other, "variant_of", "") in wanted:
            return other
    able = [*takes, *(str(getattr(c, "variant_of", "")) for c in takes.values() if getattr(c, "variant_of", ""))]
    note = str(getattr(cls, "flow_note", "")) if prediction_type == "flow" else ""
    raise OptionError(
        f"sampler {canonical!r} does not run {prediction_type!r} models"
        + (f" ({note})" if note else "")
        + f"; use one of {', '.join(sorted(set(able)))}"
    )


def implied_prediction_type(config: Mapping[str, Any] | None) -> str | None:
    """The prediction type a diffusers scheduler config implies: ``flow`` for a ``FlowMatch*``
    scheduler's config (they have no ``prediction_type`` key), else the config's own, if any."""
    if not isinstance(config, Mapping):
        return None  # None, or a bad config the scheduler's constructor refuses
    if str(config.get("_class_name", "")).startswith("FlowMatch"):
        return "flow"
    value = config.get("prediction_type")
    return value if isinstance(value, str) and value in PREDICTION_TYPES else None


def sampler_label(name: str, registry: SchedulerRegistry | None = None) -> str:
    """The display name A1111 writes for a sampler ("Euler a", "DPM++ 2M"): the class's ``label``;
    for a class without one (a third-party scheduler), its first alias, else its name. A name no
    plugin registers is returned as it is (reading back an image from another tool)."""
    cls = _registry(registry).get(name)
    if cls is None:
        return name
    label = getattr(cls, "label", "")
    if isinstance(label, str) and label:
        return label
    aliases = tuple(getattr(cls, "aliases", ()))
    return str(aliases[0]) if aliases else str(cls.name)


def schedule_label(schedule: str) -> str:
    """The display name A1111 writes for a schedule ("Karras"); unknown ones as they are."""
    return SCHEDULE_LABELS.get(schedule, schedule)


def create_scheduler(
    name: str,
    schedule: str | None = None,
    config: Mapping[str, Any] | None = None,
    prediction_type: str | None = None,
    registry: SchedulerRegistry | None = None,
    **options: float,
) -> Scheduler:
    """A ready scheduler: ``create_scheduler("DPM++ 2M Karras", schedule=None, config=cfg)``.

    ``schedule`` None takes the name's suffix ("... Karras"), else "normal". ``config`` is
    the model's diffusers ``scheduler_config.json`` dict (None: Stable Diffusion 1.x's);
    ``prediction_type`` overrides the config's (a ``FlowMatch*`` config implies ``"flow"``); a
    sampler that does not run that prediction type is replaced by its variant that does
    (``scheduler_class``): "Euler" on a flow model is ``euler_flow``. ``options`` are the sampler's own settings
    (``eta=`` for DDIM, ``s_noise=`` for euler_a, dpmpp_2m_sde and dpmpp_sde); one the sampler
    does not take is an OptionError.
    """
    reg = _registry(registry)
    canonical, resolved_schedule = resolve(name, schedule, registry=reg)
    prediction = prediction_type if prediction_type is not None else implied_prediction_type(config)
    cls = scheduler_class(canonical, reg, prediction)
    instance: Scheduler = cls(schedule=resolved_schedule, config=config, prediction_type=prediction_type, **options)
    return instance
