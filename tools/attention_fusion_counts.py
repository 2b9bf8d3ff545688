"""How many attention patterns each SD-family graph has and how many sdkit-ggml's attention pass
fuses into ``ggml_flash_attn_ext`` under each policy (``compiler/lowering_modes.py``):

- ``fp32 auto``: ``attention="plain"`` (``precision="fp32"``, ``flash_attn="auto"``);
- ``fp16 / on``: ``attention="all"`` (``precision="fp16"`` or ``flash_attn="on"``).

Reads the weightless shipped graphs (``sdkit.families.shipped``) and the fixture graphs without
weights; structure only, nothing runs. An attention pattern is a Softmax whose output (through
Casts) is read by a MatMul.

    python tools/attention_fusion_counts.py [--shipped-only | --fixtures-only] [NAME_OR_PATH ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

from sdkit.families import shipped
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.compiler.passes import apply_passes

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIRS = (
    "fixtures/sd",
    "fixtures/tiny_pipeline",
    "fixtures/tiny_xl",
    "fixtures/tiny_flow",
    "fixtures/families/tiny",
)


def attention_patterns(proto: onnx.ModelProto) -> int:
    """Softmax nodes whose output, through Casts, a MatMul reads."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    count = 0
    for node in proto.graph.node:
        if node.op_type != "Softmax":
            continue
        frontier = [str(node.output[0])]
        while frontier:
            users = readers.get(frontier.pop(), [])
            if any(u.op_type == "MatMul" for u in users):
                count += 1
                break
            frontier += [str(u.output[0]) for u in users if u.op_type == "Cast"]
    return count


def fused(proto: onnx.ModelProto, patterns: str) -> int:
    nodes = apply_passes(proto, attention=patterns).graph.node
    return sum(1 for n in nodes if n.domain == FUSED_DOMAIN and n.op_type == "Attention")


def counts(proto: onnx.ModelProto) -> tuple[int, int, int]:
    """(attention patterns, fused at fp32 auto, fused at fp16 / flash_attn=on)."""
    return attention_patterns(proto), fused(proto, "plain"), fused(proto, "all")


def load(name: str) -> onnx.ModelProto:
    if name.endswith(".onnx"):
        return onnx.load_model(name, load_external_data=False)
    return shipped.load_graph(name).proto


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="*", help="shipped graph names or .onnx paths (default: all)")
    parser.add_argument("--shipped-only", action="store_true")
    parser.add_argument("--fixtures-only", action="store_true")
    args = parser.parse_args(argv)
    names = list(args.graphs)
    if not names:
        if not args.fixtures_only:
            names += shipped.names()
        if not args.shipped_only:
            names += sorted(str(p.relative_to(ROOT)) for d in FIXTURE_DIRS for p in (ROOT / d).rglob("*.onnx"))
    print("| graph | attention patterns | fused, fp32 auto | fused, fp16 / on |\n|---|---|---|---|")
    for name in names:
        path = str(ROOT / name) if name.endswith(".onnx") and not Path(name).is_absolute() else name
        found, plain, every = counts(load(path))
        if found or plain or every:
            print(f"| {name} | {found} | {plain} | {every} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
