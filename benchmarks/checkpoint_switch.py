"""Switching between two checkpoints of one family: refit in place vs compiling anew.

    python benchmarks/checkpoint_switch.py tiny [--backends reference,ggml,openvino] [--repeat 3]
    python benchmarks/checkpoint_switch.py full A.safetensors B.safetensors [--component vae_decoder]
        [--graphs DIR] [--size 32]

``tiny``: the tiny SD 1.x family (``fixtures/families/tiny/sd1``, fp16 then bf16 file), whole
pipelines: ``load_pipeline(A)`` (compile every component), ``pipe.set_checkpoint(B)`` (each
compiled component refit with B's weights, or released where the backend cannot refit), and
``load_pipeline(B)`` in a fresh pipeline (the recompile a switch would cost without refit).

``full``: one component of two full-size checkpoints (made with ``checkpoint_memory.py --make``;
two seeds): compile it with A's weights, ``Component.set_source(B)`` (refit), and a fresh compile
with B's; the refit engine's output is checked against the fresh one's. A compile's time counts
``prepare`` and what its first run costs beyond a steady run (backends that build per input shape
build then); likewise a refit's.

Medians of ``--repeat`` runs, all in one process; name the CPU and the load average with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "fixtures" / "families" / "tiny" / "sd1"


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def register_tiny_families() -> None:
    """The tests' tiny families, registered as a plugin (see packages/sdkit-core/tests/conftest.py)."""
    import importlib.util

    from sdkit.plugins import Plugins, manager

    spec = importlib.util.spec_from_file_location("sdkit_bench_tiny", ROOT / "packages/sdkit-core/tests/conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sdkit_bench_tiny"] = module
    spec.loader.exec_module(module)
    entry = importlib.metadata.EntryPoint(name="tiny-families", value="sdkit_bench_tiny", group="sdkit")
    manager._plugins = Plugins([*importlib.metadata.entry_points(group="sdkit"), entry])


def tiny(backends: list[str], repeat: int) -> None:
    import sdkit

    register_tiny_families()
    a, b = TINY / "sd1_fp16.safetensors", TINY / "sd1_bf16.safetensors"
    request = {"steps": 2, "width": 32, "height": 32, "seed": 1, "sampler": "euler", "output_type": "np"}
    print(f"{'backend':<10} {'load A':>8} {'set_checkpoint(B)':>18} {'load B':>8}  swaps")
    for backend in backends:
        loads, switches, fresh = [], [], []
        swaps: dict[str, str] = {}
        for _ in range(repeat):
            seconds, pipe = timed(lambda backend=backend: sdkit.load_pipeline(a, backend=backend))
            loads.append(seconds)
            seconds, swaps = timed(lambda pipe=pipe: pipe.set_checkpoint(b))
            switches.append(seconds)
            switched = pipe.generate("a castle", **request)
            pipe.close()
            seconds, other = timed(lambda backend=backend: sdkit.load_pipeline(b, backend=backend))
            fresh.append(seconds)
            assert np.abs(other.generate("a castle", **request) - switched).max() <= 1e-5
            other.close()
        used = ", ".join(f"{k}={v}" for k, v in swaps.items())
        print(
            f"{backend:<10} {statistics.median(loads):>7.2f}s {statistics.median(switches):>17.2f}s "
            f"{statistics.median(fresh):>7.2f}s  {used}"
        )


def full(a: Path, b: Path, component: str, backends: list[str], repeat: int, size: int) -> None:
    from sdkit.families import builtin, load_checkpoint
    from sdkit.pipelines import GraphWithWeights

    mapped_a, mapped_b = load_checkpoint(a, builtin.FAMILIES), load_checkpoint(b, builtin.FAMILIES)
    graph = mapped_a.family.components[component].load_graph()
    rng = np.random.default_rng(0)
    latent = size // 8
    inputs = {
        "vae_decoder": {"latent_sample": (1, 4, latent, latent)},
        "vae_encoder": {"sample": (1, 3, size, size)},
        "unet": {"sample": (1, 4, latent, latent), "timestep": (1,), "encoder_hidden_states": (1, 77, 768)},
    }[component]
    feeds = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in inputs.items()}
    print(f"{mapped_a.family.label} {component}: {a.name} -> {b.name}, input {[v.shape for v in feeds.values()]}")
    columns = ("compile A", "refit B", "compile B", "run", "refit vs fresh")
    print(f"{'backend':<10} " + " ".join(f"{c:>15}" for c in columns))
    for backend in backends:
        builds, refits, fresh, runs = [], [], [], []
        worst = 0.0
        for _ in range(repeat):
            build, steady, part = _build(component, graph, mapped_a.weights[component], backend, feeds)
            builds.append(build)
            runs.append(steady)
            source_b = GraphWithWeights(lambda: graph, mapped_b.weights[component])
            seconds, how = timed(lambda part=part, source=source_b: part.set_source(source))
            assert how == "refit", how
            first, refit_out = timed(lambda part=part: part.run(feeds))
            refits.append(seconds + max(first - steady, 0.0))
            part.release()
            build, _, other = _build(component, graph, mapped_b.weights[component], backend, feeds)
            fresh.append(build)
            fresh_out = other.run(feeds)
            other.release()
            worst = max(worst, *(float(np.abs(refit_out[k] - fresh_out[k]).max()) for k in fresh_out))
        medians = [statistics.median(v) for v in (builds, refits, fresh, runs)]
        print(f"{backend:<10} " + " ".join(f"{m:>14.2f}s" for m in medians) + f" {worst:>15.1e}")


def _build(
    component: str, graph: Any, weights: Any, backend: str, feeds: dict[str, np.ndarray]
) -> tuple[float, float, Any]:
    """Compile time (``prepare`` plus what the first run costs over a steady one: backends that
    build per input shape do it then), the steady run time, and the component."""
    from sdkit.pipelines import Component, GraphWithWeights

    part = Component(component, GraphWithWeights(lambda: graph, weights), backend)
    prepare = timed(part.prepare)[0]
    first = timed(lambda: part.run(feeds))[0]
    steady = timed(lambda: part.run(feeds))[0]
    return prepare + max(first - steady, 0.0), steady, part


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("tiny", "full"))
    parser.add_argument("files", nargs="*", help="full: the two checkpoints")
    parser.add_argument("--backends", default="reference,ggml,openvino")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--component", default="vae_decoder")
    parser.add_argument("--size", type=int, default=256, help="full vae_decoder: output pixels (default: %(default)s)")
    parser.add_argument("--graphs", default="", help="read the shipped graphs from this folder")
    args = parser.parse_args()
    if args.graphs:
        from sdkit.families import shipped

        shipped.graphs_dir = lambda: Path(args.graphs)  # type: ignore[assignment]
    print(f"cpu: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    backends = [b for b in args.backends.split(",") if b]
    if args.mode == "tiny":
        tiny(backends, args.repeat)
    else:
        full(Path(args.files[0]), Path(args.files[1]), args.component, backends, args.repeat, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
