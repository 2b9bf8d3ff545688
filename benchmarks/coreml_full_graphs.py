"""sdkit-coreml's translator on the shipped full-size graphs, on any OS: graph -> MIL program
(``build_program``: every node translated, coremltools' type inference over every op, then
constant folding and dead-code elimination) with placeholder weights, no Core ML runtime.

    nice python benchmarks/coreml_full_graphs.py [NAME ... | all] [--static] [--target macOS13]

Placeholder weights are zero-stride views of one zero per initializer (``np.broadcast_to``), so
a 12B-parameter transformer costs no weight memory; MIL keeps a const's array as given. The
program is not handed to ``ct.convert`` (its passes would materialize the weights: 48 GB of fp32
for Flux). ``--static`` fixes the symbolic dims first, as sdkit does for a static-shape package
(1024 px, see STATIC); without it they stay MIL symbols. Prints per graph: seconds, peak RSS,
op count and histogram, output shapes. Default graphs: Flux.1-dev and SD3 Medium.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter

import numpy as np
from onnx import helper

from sdkit.families import shipped
from sdkit.model import Graph
from sdkit_coreml.package import operations
from sdkit_coreml.program import build_program
from sdkit_coreml.runtime import quiet_conversion, target_named

DEFAULT = ("flux_dev_transformer", "sd3_medium_transformer")
# --static: 1024 px images (128x128 latents; Flux packs 2x2 patches: 4,096 image tokens), batch 1,
# 512 T5 tokens for Flux / Chroma (their masks cover text + image tokens), 333 for SD3 (77 CLIP + 256
# T5), 77 CLIP tokens
STATIC = {"batch": 1, "image_tokens": 4096, "text_tokens": 512, "tokens": 4608, "height": 128, "width": 128,
          "sequence": 77}  # fmt: skip
STATIC_BY_GRAPH = {
    "t5xxl_encoder": {"sequence": 512},
    "sd3_medium_transformer": {"text_tokens": 333},
    "sd35_medium_transformer": {"text_tokens": 333},
    "vae_encoder": {"height": 1024, "width": 1024},
    "flux_vae_encoder": {"height": 1024, "width": 1024},
}


def placeholders(graph: Graph) -> dict[str, np.ndarray]:
    """A zero-stride view per initializer: the right shape and dtype, one element of memory."""
    return {
        t.name: np.broadcast_to(np.zeros((), helper.tensor_dtype_to_np_dtype(t.data_type)), tuple(t.dims))
        for t in graph.proto.graph.initializer
    }


def static(name: str, graph: Graph) -> Graph:
    dims = {**STATIC, **STATIC_BY_GRAPH.get(name, {})}
    shapes = {i.name: tuple(dims.get(d, d) if isinstance(d, str) else d for d in i.shape) for i in graph.inputs}
    return graph.with_input_shapes(shapes)  # type: ignore[arg-type]


def translate(name: str, fixed: bool, target: str) -> None:
    graph = shipped.load_graph(name)
    graph = static(name, graph) if fixed else graph
    weights = placeholders(graph)
    start = time.perf_counter()
    with quiet_conversion():
        program, _ = build_program(graph, weights, target_named(target))
    seconds = time.perf_counter() - start
    function = program.functions["main"]
    ops = Counter(op.op_type for op in operations(function))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{name} ({'static' if fixed else 'symbolic'} dims, {target}): {len(graph.nodes)} ONNX nodes -> "
          f"{sum(ops.values())} MIL ops in {seconds:.1f} s, peak RSS {peak:.0f} MB", flush=True)  # fmt: skip
    print(f"  outputs: {[(v.name, tuple(str(d) for d in v.shape)) for v in function.outputs]}")
    print(f"  ops: {dict(ops.most_common())}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(DEFAULT), help="shipped graphs, or 'all'")
    parser.add_argument("--static", action="store_true", help="fix the symbolic dims (1024 px) first")
    parser.add_argument("--target", default="macOS13", choices=["macOS13", "macOS14", "macOS15"])
    args = parser.parse_args()
    for name in shipped.names() if args.names == ["all"] else args.names:
        translate(name, args.static, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
