"""sdkit-ggml's own hook: third-party converters, published through core's ``sdkit_addhooks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from sdkit.plugins.hookspecs import PROJECT

if TYPE_CHECKING:
    from sdkit_ggml.compiler.registry import ConverterRegistry

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def sdkit_ggml_register_converters(registry: ConverterRegistry) -> None:
    """Add ONNX op converters with ``registry.add(Converter(...))`` or the
    ``@registry.register("Op", since_version=N)`` decorator.

    Called once per plugin set, when the ggml backend is first probed, checks or compiles,
    after the built-in converters are registered, one plugin at a time
    (``sdkit_ggml.converter_plugins``). A plugin may override a built-in (same domain, op and
    since_version; listed in ``registry.overrides()``); two plugins registering the same key
    is an error. A plugin whose hook raises is dropped whole and listed by ``sdkit doctor``.
    """
