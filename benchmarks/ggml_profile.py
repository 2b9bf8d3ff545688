"""Where sdkit-ggml spends its time: time per ggml op kind and its share, per benchmark case.

    python benchmarks/ggml_profile.py vae256 unet512 taef2 [--precision fp32] [--threads 2] [--top 12]

Each node of the compiled ggml graph is timed on its own through ggml's scheduler eval
callback (``sdkit_ggml.runtime.profile``); each node keeps its fastest of ``--repeat`` timed
computes. MUL_MAT rows also give the achieved GFLOP/s. ``--json`` writes every node.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases
import machine


def profile_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import sdkit
    from sdkit_ggml.runtime.profile import profile_program

    case = cases.CASES[name]
    feeds = cases.feeds(case)
    start = time.perf_counter()
    compiled = sdkit.compile(
        cases.model_path(case),
        backend="ggml",
        input_shapes={k: v.shape for k, v in feeds.items()},
        threads=args.threads,
        precision=args.precision,
    )
    compiled.run(feeds)
    compile_s = time.perf_counter() - start
    program = compiled.program_for(feeds)
    profile = profile_program(program, feeds, args.threads, repeat=args.repeat)
    print(f"\n## {case.title}: ggml {args.precision}, {args.threads} threads, {program.nodes} graph nodes")
    print(f"(compile + first run {compile_s:.1f} s; load average {machine.load_average()})\n")
    print(profile.table(args.top))
    chosen = list(compiled.info["conv_strategies"].values())  # SDKIT_GGML_CONV / conv= decides
    print(
        f"conv strategy ({compiled.info['conv']}): "
        + ", ".join(f"{chosen.count(s)} shapes {s}" for s in sorted(set(chosen)))
    )
    slowest = sorted(profile.nodes, key=lambda n: n.seconds, reverse=True)[: args.top]
    print("\nslowest nodes:")
    for node in slowest:
        rate = f" {node.flop / node.seconds / 1e9:6.1f} GFLOP/s" if node.flop and node.seconds else ""
        print(f"  {node.seconds:7.3f} s  {node.op:<12} ne={list(node.shape)}{rate}  {node.name[:60]}")
    return {
        "case": name,
        "precision": args.precision,
        "total_s": profile.total_s,
        "plain_s": profile.plain_s,
        "conv_strategies": compiled.info["conv_strategies"],
        "kinds": [vars(k) for k in profile.by_kind()],
        "nodes": [vars(n) for n in profile.nodes],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", choices=sorted(cases.CASES))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "q8_0"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    info = machine.describe()
    print(f"# ggml profile: {machine.headline(info)}")
    print("ggml CPU backend: " + ", ".join(f"{k}={v}" for k, v in info["ggml_cpu_build"].items()))
    results = [profile_case(name, args) for name in args.cases]
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "profiles": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
