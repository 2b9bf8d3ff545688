"""Peak memory of the SD VAE decoder at 1024 and 2048 px: keep vs offload vs tiled.

    nice .venv/bin/python benchmarks/vae_tiling.py [--sizes 1024,2048] [--backend openvino] [--threads 2]

The decoder is the full-size SD 1.5 VAE decoder with seeded random weights
(``fixtures/sd_graphs.py``, ``sd15_vae_decoder``; written once into ``fixtures/cache``). It runs
through ``sdkit.pipelines.stages.vae.decode``, the stage the pipelines call, as a ``Component`` under
each memory policy, whole or with ``tile`` (512 px tiles, 128 px overlap: what
``vae_tiling=True`` / ``--vae-tiling`` does). Each (size, mode) runs in a fresh process (peak RSS
is a per-process high-water mark): ``peak_mb`` is ``ru_maxrss``, ``baseline_mb`` the RSS after
the imports, ``resident_mb`` the RSS after the decode (what stays between images: the compiled
decoder under ``keep``, nothing under ``offload``).

The untiled and tiled images of the same latents are compared in the parent: max and mean
|diff| on [0, 1] pixels, and a seam check: the mean |step| between neighbouring pixel rows /
columns where one tile's blend zone begins or ends, tiled over untiled (1.0: the tile borders
add no edge). ``--plan`` adds ggml's planned weight and compute buffers of an untiled decode
at each size and of one tile (exact, nothing run). ``--taef2`` adds the same comparison for the
real TAEF2 decoding a smooth gradient (``sdkit.testing.seams``: the seam measures; the SD
decoder's random weights make noise, TAEF2 makes an image). A mode whose estimated peak exceeds
``--max-gb`` is not run (say so in the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TILE = 512  # --tile changes it
RESULTS = ROOT / "benchmarks" / "results"
CHILD = r"""
import json, os, resource, sys, time
import numpy as np
from pathlib import Path
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.sources import OnnxFileSource
graph, backend, policy, size, tile, threads, out = sys.argv[1:8]
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
size = int(size)
latents = np.random.default_rng(0).standard_normal((1, 4, size // 8, size // 8)).astype(np.float32) * 0.18215
decoder = Component("vae_decoder", OnnxFileSource(Path(graph)), backend, None, {"threads": int(threads)}, policy)
start = time.perf_counter()
pixels = vae.decode(decoder, latents, PipelineConfig(name="sd15"), int(tile) or None)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
resident = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
np.save(out, pixels)
print(json.dumps({"baseline_mb": baseline / 1024, "peak_mb": peak / 1024, "resident_mb": resident,
                  "seconds": seconds, "backend": decoder.backend_name}))
"""


def measure(graph: Path, backend: str, policy: str, size: int, tile: int, threads: int, out: Path) -> dict[str, object]:
    args = [graph, backend, policy, size, tile, threads, out]
    result = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{policy} {size} tile={tile}: failed\n{result.stderr[-3000:]}")
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def compare(tiled: np.ndarray, whole: np.ndarray, size: int, tile: int) -> dict[str, float]:
    """max/mean |tiled - untiled| and the seam measures (``sdkit.testing.seams``) of two [H, W, 3] images."""
    from sdkit.pipelines.stages.vae import tile_overlap
    from sdkit.testing.seams import blend_edges, seam_report

    edges = blend_edges(size, tile, tile_overlap(tile, 8))
    return {k: round(v, 5) for k, v in vars(seam_report(tiled, whole, edges, edges)).items()}


def taef2_gradient(size: int, tile: int, backend: str, threads: int) -> dict[str, object]:
    """The real TAEF2 (``models/taef2``): a smooth gradient encoded whole, decoded whole and in
    tiles (the tile and overlap of ``vae_tiling``); its output is an image, not noise, so this is
    where a seam would show."""
    import sdkit
    from sdkit.model import load_onnx
    from sdkit.pipelines.stages.tiling import tiled_decode
    from sdkit.pipelines.stages.vae import tile_overlap
    from sdkit.testing.seams import gradient_image

    def compiled(name: str) -> tuple[object, str, str]:
        model = load_onnx(ROOT / "models" / "taef2" / f"taef2_{name}.onnx")
        return sdkit.compile(model, backend=backend, threads=threads), model.inputs[0].name, model.outputs[0].name

    (encoder, e_in, e_out), (decoder, d_in, d_out) = compiled("encoder"), compiled("decoder")

    def decode(latent: np.ndarray) -> np.ndarray:
        return np.asarray(decoder.run({d_in: latent})[d_out], dtype=np.float32)  # type: ignore[attr-defined]

    latent = encoder.run({e_in: gradient_image(size, size)})[e_out]  # type: ignore[attr-defined]
    whole = decode(latent)
    tiled = tiled_decode(latent, decode, tile // 8, tile_overlap(tile, 8) // 8)
    images = [np.clip(image[0], 0.0, 1.0).transpose(1, 2, 0) for image in (tiled, whole)]
    return {"size": size, "mode": "TAEF2 gradient, tiled vs untiled", **compare(*images, size, tile)}


def ggml_plan(graph: Path, size: int, threads: int) -> dict[str, object]:
    """ggml's buffers for one decode of ``size`` px, exact and load-independent: the compiled
    program's weight and compute buffers (gallocr plans every intermediate before the run, which
    then touches all of it), read after compiling the one shape, nothing run."""
    import sdkit
    from sdkit.errors import SdkitError
    from sdkit.model import load_onnx

    model = load_onnx(graph)
    shape = [1, 4, size // 8, size // 8]
    row: dict[str, object] = {
        "size": size,
        "mode": "ggml plan",
        "im2col_chunk_mb": os.environ.get("SDKIT_GGML_IM2COL_CHUNK_MB"),
    }
    try:
        compiled = sdkit.compile(model, backend="ggml", input_shapes={model.inputs[0].name: shape}, threads=threads)
    except SdkitError as exc:
        return {**row, "error": str(exc)}
    memory = compiled.memory()  # type: ignore[attr-defined]
    compiled.close()
    return {**row, **{f"{k}_mb": round(v / 2**20) for k, v in memory.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--backend", default="openvino")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tile", type=int, default=TILE, help="tile side in pixels (default %(default)s)")
    parser.add_argument("--modes", default="keep,offload,keep+tiled,offload+tiled", help="which to run, in order")
    parser.add_argument(
        "--taef2", action="store_true", help="also decode a gradient with the real TAEF2, tiled vs untiled"
    )
    parser.add_argument("--plan", action="store_true", help="ggml only: the planned buffers of each size and the tile")
    parser.add_argument("--max-gb", type=float, default=8.0, help="skip a mode whose estimated peak is above this")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "fixtures"))
    sys.path.insert(0, str(ROOT / "packages" / "sdkit-core" / "src"))
    import sd_graphs

    graph = sd_graphs.model_path("sd15_vae_decoder")
    print(
        f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} cpus; backend {args.backend}, {args.threads} threads"
    )
    rows: list[dict[str, object]] = []
    tile_size = args.tile
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.plan:
        for size in sorted({tile_size, *(int(s) for s in args.sizes.split(","))}):
            rows.append(ggml_plan(graph, size, args.threads))
            print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            images = {}
            for name in filter(None, args.modes.split(",")):
                policy, tile = name.split("+")[0], tile_size if name.endswith("+tiled") else 0
                estimate = 0.3 + 4.6 * (size / 1024) ** 2 if tile == 0 else 1.4  # GB: measured 1024 px, scaled
                mode = f"{policy}{' + tiled' if tile else ''}"
                if estimate > args.max_gb:
                    print(f"{size} px {mode}: not run (estimated peak {estimate:.0f} GB > --max-gb {args.max_gb:g})")
                    rows.append({"size": size, "mode": mode, "skipped_estimate_gb": estimate})
                    continue
                out = Path(tmp) / f"{size}-{policy}-{tile}.npy"
                data = measure(graph, args.backend, policy, size, tile, args.threads, out)
                images[(policy, tile)] = np.load(out)
                rows.append({"size": size, "mode": mode, **data})
                print(json.dumps(rows[-1]), flush=True)
                (RESULTS / "vae_tiling.json").write_text(json.dumps(rows, indent=1))
            whole, tiled = images.get(("keep", 0)), images.get(("keep", tile_size))
            if whole is not None and tiled is not None and size > tile_size:
                rows.append(
                    {
                        "size": size,
                        "mode": "SD VAE, keep + tiled vs keep",
                        **compare(tiled[0], whole[0], size, tile_size),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            if args.taef2 and size > tile_size:
                rows.append(taef2_gradient(size, tile_size, args.backend, args.threads))
                print(json.dumps(rows[-1]), flush=True)
            (RESULTS / "vae_tiling.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
