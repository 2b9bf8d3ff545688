"""Graph passes: rewrites of the ONNX graph applied once before lowering (pattern fusions such
as attention or GroupNorm+SiLU into one node of sdkit-ggml's own domain, identity and dead-node
removal).

Compile (``GgmlCompiledModel``) and ``check()`` both lower ``apply_passes(proto)``, so the two
keep deciding on the same nodes. A pass returns a new ModelProto and leaves its input alone;
it must keep the graph's inputs, outputs and initializer names (refit replays by name). Every
pass only restructures the graph: the fused nodes are built from ggml ops by their converters
(``converters/fused.py``), so the passes hold on every ggml backend.

Each pass can be switched off for measurement (the on/off table in benchmarks/README.md):
``SDKIT_GGML_PASSES_OFF=attention,group_norm`` (or ``all``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx

from sdkit_ggml.compiler import pass_attention, pass_cleanup, pass_fusions

OFF_ENV = "SDKIT_GGML_PASSES_OFF"


@dataclass(frozen=True)
class GraphPass:
    name: str
    run: Callable[[onnx.ModelProto], onnx.ModelProto]
    doc: str


# In order: identities first (they hide the patterns), fusions, then what became dead.
PASSES: tuple[GraphPass, ...] = (
    GraphPass("identity", pass_cleanup.remove_identities, "Identity, x*1, x/1, x+0 and same-type Cast bypassed"),
    GraphPass("transpose", pass_cleanup.fold_transposes, "Transpose of a Transpose composed (or dropped)"),
    GraphPass("attention", pass_attention.fuse_attention, "MatMul-Softmax-MatMul to ggml_flash_attn_ext"),
    GraphPass("group_norm", pass_fusions.fuse_group_norm, "Reshape-InstanceNorm-Reshape-Mul-Add to one norm"),
    GraphPass("silu", pass_fusions.fuse_silu, "x*Sigmoid(x) to ggml_silu"),
    GraphPass("conv_concat", pass_fusions.fuse_conv_concat, "Conv of a channel Concat to one product per part"),
    GraphPass("dead", pass_cleanup.remove_dead, "nodes no output depends on dropped"),
)
PASS_NAMES = tuple(p.name for p in PASSES)


def disabled_passes(spec: str | None = None) -> frozenset[str]:
    """The pass names switched off by ``spec`` (default: $SDKIT_GGML_PASSES_OFF)."""
    text = os.environ.get(OFF_ENV, "") if spec is None else spec
    names = {part.strip() for part in text.split(",") if part.strip()}
    if "all" in names:
        return frozenset(PASS_NAMES)
    return frozenset(names & set(PASS_NAMES))


def enabled_passes(off: Iterable[str] | None = None) -> tuple[GraphPass, ...]:
    skip = disabled_passes() if off is None else frozenset(off)
    return tuple(p for p in PASSES if p.name not in skip)


def apply_passes(
    proto: onnx.ModelProto, passes: tuple[GraphPass, ...] | None = None, *, attention: str = "plain"
) -> onnx.ModelProto:
    """``attention``: the attention patterns fused (``lowering_modes.attention_patterns``:
    "plain", "all" or "none"; check() and the fp32 default take "plain")."""
    for graph_pass in enabled_passes() if passes is None else passes:
        if graph_pass.name == "attention":
            proto = pass_attention.fuse_attention(proto, attention)
        else:
            proto = graph_pass.run(proto)
    return proto
