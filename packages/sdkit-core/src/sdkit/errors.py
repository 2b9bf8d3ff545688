"""The error hierarchy: every failure a user can cause is an ``SdkitError``.

Each error carries what the user needs to act on it (which node, which input, which
install command). The CLI prints ``str(error)`` on one line and exits 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class SdkitError(Exception):
    """Root of every error sdkit raises on purpose."""


class PluginLoadError(SdkitError):
    """A plugin failed to import or register (raised only with ``SDKIT_STRICT_PLUGINS=1``)."""


class DuplicateNameError(SdkitError):
    """Two plugins registered the same backend, loader or scheduler name."""


class BackendUnavailableError(SdkitError):
    """A backend's runtime is missing or unusable on this machine."""

    def __init__(self, backend: str, reason: str, install_hint: str = "") -> None:
        self.backend = backend
        self.reason = reason
        self.install_hint = install_hint
        message = f"backend {backend!r} is unavailable: {reason}"
        if install_hint:
            message += f" ({install_hint})"
        super().__init__(message)


class NoBackendError(SdkitError):
    """Automatic choice found no usable backend; lists every candidate and why."""

    def __init__(self, rejected: Sequence[tuple[str, str]]) -> None:
        self.rejected = list(rejected)
        reasons = "; ".join(f"{name}: {why}" for name, why in self.rejected)
        super().__init__(f"no backend can run this model ({reasons or 'no backend is registered'})")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix, or an empty string when nothing is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownNameError(SdkitError):
    """A name (backend, scheduler, device kind...) that nothing registered."""

    kind = "name"

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown {self.kind} {name!r}{did_you_mean(name, self.known)}; known: {', '.join(self.known) or 'none'}"
        )


class UnknownBackendError(UnknownNameError):
    kind = "backend"


class UnknownSchedulerError(UnknownNameError):
    """An unknown sampler (``kind="sampler"``, the default) or sigma schedule (``kind="schedule"``)."""

    kind = "sampler"

    def __init__(self, name: str, known: Iterable[str], kind: str = "sampler") -> None:
        self.kind = kind
        super().__init__(name, known)


@dataclass(frozen=True)
class UnsupportedNode:
    """One node a backend cannot run, and why."""

    node: str
    op_type: str
    domain: str
    opset: int
    reason: str

    def __str__(self) -> str:
        domain = f"{self.domain}." if self.domain else ""
        return f"{self.node or '<unnamed>'} ({domain}{self.op_type}, opset {self.opset}): {self.reason}"


class UnsupportedModelError(SdkitError):
    """A backend cannot run a model; lists every offending node at once."""

    def __init__(self, backend: str, problems: Sequence[UnsupportedNode | str]) -> None:
        self.backend = backend
        self.problems = list(problems)
        shown = "; ".join(str(p) for p in self.problems[:20])
        more = f"; and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        super().__init__(f"backend {backend!r} cannot run this model: {shown}{more}")


class UnsupportedOperatorError(UnsupportedModelError):
    """Every problem is an operator the backend lacks."""


class ModelFormatError(SdkitError):
    """A model or weights file is missing, truncated, malformed or of a refused format."""


class UnsupportedFamilyError(SdkitError):
    """A recognised model family whose pipeline is not available (not built yet, or its plugin
    is not installed): the file is fine, sdkit cannot generate with it."""


class InputError(SdkitError):
    """Inputs do not match the model: unknown or missing names, wrong shapes or dtypes."""


class UnsupportedFeatureError(InputError):
    """A request asks a pipeline for a feature its family does not declare (hires fix, a mask,
    VAE tiling... on a pipeline without them; ``sdkit.pipelines.features.feature``): refused by the plan,
    before anything compiles or runs, never silently dropped. ``features``: the names of the
    features refused; ``family``: the pipeline family's name."""

    def __init__(self, family: str, features: Sequence[str], asked_by: Sequence[str], supported: Sequence[str]) -> None:
        self.family = family
        self.features = tuple(features)
        asked = ", ".join(f"{name} ({how})" for name, how in zip(features, asked_by, strict=True))
        super().__init__(f"{family} pipelines do not support {asked}; they support: {', '.join(supported)}")


class ResourceLimitError(SdkitError):
    """A model or request would need more memory than the budget (``sdkit.limits``); refused
    before anything is allocated."""


class BackendCrashedError(SdkitError):
    """A backend's native code died in an isolated child process (``isolate=True``); the
    message names the backend and the signal."""

    def __init__(self, backend: str, what: str, signal_name: str, detail: str = "") -> None:
        self.backend = backend
        self.signal_name = signal_name
        message = f"backend {backend!r} crashed during {what} ({signal_name})"
        if detail:
            message += f": {detail}"
        super().__init__(message)


class NonFiniteError(SdkitError):
    """NaN or infinity appeared in a generation (a weight, a LoRA or a scheduler config that
    holds them); the message names the first place, the component and the step, where they did."""


class OptionError(SdkitError):
    """Unknown or invalid compile options."""


class DeviceError(SdkitError):
    """A device string that does not parse, or a device the backend does not have."""


class CacheError(SdkitError):
    """The compiled-artifact cache could not be read or written."""


class MissingDependencyError(SdkitError):
    """An optional feature needs a package that is not installed; the message names the pip command."""
