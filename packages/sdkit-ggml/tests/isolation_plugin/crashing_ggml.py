"""A test plugin: the ggml backend, with a real ``GGML_ASSERT`` abort (a reshape to the wrong
element count, inside libggml) at compile, or at the run of a batch of 3, as ``CRASH_WHEN``
says. Found through the entry point next to it when this folder is on ``sys.path``."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from sdkit.plugins import hookimpl
from sdkit_ggml.backend import GgmlBackend


def ggml_assert() -> None:
    from sdkit_ggml.runtime.lib import InitParams, load_library

    lib = load_library()
    ctx = lib.ggml_init(InitParams(1 << 20, None, True))
    lib.ggml_reshape_4d(ctx, lib.ggml_new_tensor_4d(ctx, 0, 4, 1, 1, 1), 5, 1, 1, 1)


class CrashingGgml(GgmlBackend):
    name = "crashing-ggml"
    priority = -1000

    def compile(self, graph: Any, weights: Any, device: Any, options: Any) -> Any:
        if os.environ.get("CRASH_WHEN") == "compile":
            ggml_assert()
        compiled = super().compile(graph, weights, device, options)
        execute = compiled.execute

        def crashing_execute(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if os.environ.get("CRASH_WHEN") == "run" and next(iter(feeds.values())).shape[0] == 3:
                ggml_assert()
            result: dict[str, np.ndarray] = execute(feeds)
            return result

        compiled.execute = crashing_execute
        return compiled


@hookimpl
def sdkit_register_backends(registry: Any) -> None:
    registry.add(CrashingGgml)
