"""Changing LoRAs on a loaded pipeline: merge + refit in place vs compiling anew.

    python benchmarks/lora_switch.py tiny [--backends reference,ggml,openvino] [--repeat 3]
    python benchmarks/lora_switch.py full CHECKPOINT.safetensors [--make-lora LORA.safetensors]
        [--rank 16] [--backends ggml] [--component unet] [--size 64]

``tiny``: the tiny SD 1.x pipeline (``fixtures/families/tiny/sd1``): ``set_loras`` with the kohya
LoCon at 0.8 and the attention LoRA at 0.6 (read, merge into fresh arrays, refit every compiled
component), ``set_loras([])`` (back to the base weights), and what a recompile of the changed
components with the merged weights costs instead.

``full``: one component of a full-size checkpoint (``checkpoint_memory.py --make``) and a random
kohya LoRA of rank ``--rank`` on every attention and LoCon target of it (``--make-lora`` writes
one): ``merge_loras``, the refit (``Component.set_weights``) and a fresh compile with the merged
weights; the refit engine's output is checked against the fresh one's.

Medians of ``--repeat`` runs in one process; name the CPU and the load average with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoint_switch import _build, register_tiny_families, timed

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "fixtures" / "families" / "tiny" / "sd1"


def tiny(backends: list[str], repeat: int) -> None:
    import sdkit

    register_tiny_families()
    loras = [(TINY / "lora" / "sd1_kohya_locon.safetensors", 0.8), (TINY / "lora" / "sd1_kohya_attn.safetensors", 0.6)]
    print(f"{'backend':<10} {'set_loras':>10} {'set_loras([])':>14} {'recompile':>10}  swaps")
    for backend in backends:
        options = {"threads": 1} if backend == "ggml" else {}
        sets, clears, recompiles = [], [], []
        swaps: dict[str, str] = {}
        for _ in range(repeat):
            pipe = sdkit.load_pipeline(TINY / "sd1_fp16.safetensors", backend=backend, **options)
            seconds, swaps = timed(lambda pipe=pipe: pipe.set_loras(loras))
            sets.append(seconds)
            changed = [name for name, how in swaps.items() if name in ("unet", "text_encoder")]

            def recompile(pipe: Any = pipe, changed: list[str] = changed) -> None:
                for name in changed:
                    pipe.components[name].release()
                    pipe.components[name].prepare()

            recompiles.append(timed(recompile)[0])
            clears.append(timed(lambda pipe=pipe: pipe.set_loras([]))[0])
            pipe.close()
        used = ", ".join(f"{k}={v}" for k, v in swaps.items())
        medians = [statistics.median(v) for v in (sets, clears, recompiles)]
        print(f"{backend:<10} {medians[0]:>9.3f}s {medians[1]:>13.3f}s {medians[2]:>9.3f}s  {used}")


def make_lora(path: Path, checkpoint: Path, rank: int, component: str) -> None:
    """A random kohya LoRA (LDM names for the UNet, as sd-scripts writes SDXL's) on every Linear
    and conv weight of ``component`` that sd-scripts' LoCon adapts."""
    from safetensors.numpy import save_file

    from sdkit.families import builtin, load_checkpoint
    from sdkit.families.lora import lora_targets

    family = load_checkpoint(checkpoint, builtin.FAMILIES).family
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    for spelling, target in lora_targets(family).items():
        if target.component != component or not _kohya_target(spelling, target.name):
            continue
        shape = target.shape
        down = rng.standard_normal((rank, *shape[1:]), dtype=np.float32) * 0.01
        up = rng.standard_normal((shape[0], rank, *([1, 1] if len(shape) == 4 else [])), dtype=np.float32) * 0.01
        arrays[f"{spelling}.lora_down.weight"] = down.astype(np.float16)
        arrays[f"{spelling}.lora_up.weight"] = up.astype(np.float16)
        arrays[f"{spelling}.alpha"] = np.array(rank / 2, np.float16)
    save_file(arrays, str(path), metadata={"ss_network_module": "networks.lora", "ss_network_dim": str(rank)})
    print(f"wrote {path}: {len(arrays) // 3} modules, {path.stat().st_size / 1e6:.1f} MB")


def _kohya_target(spelling: str, name: str) -> bool:
    """What sd-scripts' LoCon adapts: UNet attention and resnet layers (its SGM names), the text
    encoder's attention and MLP projections."""
    if spelling.startswith(("lora_unet_input_blocks", "lora_unet_middle_block", "lora_unet_output_blocks")):
        return ("attentions" in name or "resnets" in name) and "norm" not in name
    return spelling.startswith("lora_te_text_model_encoder_layers") and "layer_norm" not in name


def full(checkpoint: Path, lora_path: Path, component: str, backends: list[str], repeat: int, size: int) -> None:
    from sdkit.families import builtin, load_checkpoint
    from sdkit.families.lora import merge_loras
    from sdkit.families.lora_file import open_lora

    mapped = load_checkpoint(checkpoint, builtin.FAMILIES)
    graph = mapped.family.components[component].load_graph()
    rng = np.random.default_rng(0)
    latent = size // 8
    shapes = {"sample": (1, 4, latent, latent), "timestep": (1,), "encoder_hidden_states": (1, 77, 768)}
    feeds = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
    if component == "text_encoder":
        feeds = {"input_ids": rng.integers(0, 49407, (1, 77), dtype=np.int64)}
    lora = open_lora(lora_path)
    merges = []
    for _ in range(repeat):
        seconds, merged = timed(lambda: merge_loras(mapped.family, mapped.weights, [(lora, 0.8)]))
        merges.append(seconds)
    changes = merged[component]
    print(
        f"{mapped.family.label} {component}: {len(changes)} weights changed by {lora_path.name} (rank {lora.ranks()})"
    )
    print(f"merge_loras: median {statistics.median(merges):.2f}s")
    print(f"{'backend':<10} {'compile':>10} {'refit':>10} {'fresh compile':>14} {'run':>8} {'refit vs fresh':>15}")
    for backend in backends:
        builds, refits, fresh, runs = [], [], [], []
        worst = 0.0
        for _ in range(repeat):
            build, steady, part = _build(component, graph, mapped.weights[component], backend, feeds)
            builds.append(build)
            runs.append(steady)
            seconds, how = timed(lambda part=part: part.set_weights(changes))
            assert how == "refit", how
            first, refit_out = timed(lambda part=part: part.run(feeds))
            refits.append(seconds + max(first - steady, 0.0))
            part.release()
            build, _, other = _build(component, graph, mapped.weights[component].updated(changes), backend, feeds)
            fresh.append(build)
            fresh_out = other.run(feeds)
            other.release()
            worst = max(worst, *(float(np.abs(refit_out[k] - fresh_out[k]).max()) for k in fresh_out))
        medians = [statistics.median(v) for v in (builds, refits, fresh, runs)]
        times = f"{medians[0]:>9.2f}s {medians[1]:>9.2f}s {medians[2]:>13.2f}s {medians[3]:>7.2f}s"
        print(f"{backend:<10} {times} {worst:>15.1e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("tiny", "full"))
    parser.add_argument("checkpoint", nargs="?", help="full: a full-size checkpoint")
    parser.add_argument("--make-lora", default="", help="full: write a random kohya LoRA here first")
    parser.add_argument("--lora", default="", help="full: the LoRA (default: --make-lora's)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--backends", default="reference,ggml,openvino")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--component", default="unet")
    parser.add_argument("--size", type=int, default=64, help="full: image pixels (default: %(default)s)")
    args = parser.parse_args()
    print(f"cpu: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    backends = [b for b in args.backends.split(",") if b]
    if args.mode == "tiny":
        tiny(backends, args.repeat)
        return 0
    checkpoint = Path(args.checkpoint)
    if args.make_lora:
        make_lora(Path(args.make_lora), checkpoint, args.rank, args.component)
    full(checkpoint, Path(args.lora or args.make_lora), args.component, backends, args.repeat, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
