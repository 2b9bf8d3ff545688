"""sdkit-ggml's own hook: third-party converters, published through core's ``sdkit_addhooks``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from sdkit.plugins.hookspecs import PROJECT

if TYPE_CHECKING:
    from sdkit_ggml.compiler.registry import ConverterRegistry

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def sdkit_ggml_register_converters(registry: ConverterRegistry) -> None:
    """Add ONNX op converters with ``registry.add(Converter(...))`` or the
    ``@registry.register("Op", since_version=N)`` decorator.

    Called once, when the ggml backend first compiles or checks a model, after the built-in
    converters are registered: a plugin may override a built-in (same op and version).
    """


def call_register_converters(registry: ConverterRegistry) -> None:
    """Call every plugin's ``sdkit_ggml_register_converters``."""
    from sdkit.plugins import get_plugins

    pm: Any = get_plugins().pm
    hook = getattr(pm.hook, "sdkit_ggml_register_converters", None)
    if hook is not None:
        hook(registry=registry)
