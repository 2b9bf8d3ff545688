"""Graph passes: rewrites of the ONNX graph applied once before lowering (pattern fusions such
as attention or GroupNorm+SiLU into one converter's node, or dead-node removal).

Compile (``GgmlCompiledModel``) and ``check()`` both lower ``apply_passes(proto)``, so the two
keep deciding on the same nodes. A pass returns a new ModelProto and leaves its input alone;
it must keep the graph's inputs, outputs and initializer names (refit replays by name).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

GraphPass = Callable[[onnx.ModelProto], onnx.ModelProto]

# In order. None yet: every node is lowered as exported.
PASSES: tuple[GraphPass, ...] = ()


def apply_passes(proto: onnx.ModelProto, passes: tuple[GraphPass, ...] = PASSES) -> onnx.ModelProto:
    for graph_pass in passes:
        proto = graph_pass(proto)
    return proto
