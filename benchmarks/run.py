"""sdkit's backends against their peers on the SD models, in one invocation, one process per
engine and case.

    python benchmarks/run.py                                  # every case, every engine
    python benchmarks/run.py --cases vae256,taef2 --engines ggml-fp32,onnxruntime --repeat 5
    python benchmarks/run.py --rounds 2 --compare benchmarks/results/<earlier>.json

Cases (cases.py): ``vae256``, ``vae512`` (SD 1.5 VAE decoder), ``unet512`` (one SD 1.5 UNet
step), ``taef2`` (TAEF2 decoder), ``txt2img`` (stable-diffusion.cpp's own stage timings of a
whole txt2img next to ours composed from the unet512 and vae512 medians). Engines:
``ggml-fp32``, ``ggml-fp16``, ``ggml-q8_0`` (8-bit matrix weights), ``sdkit-openvino``, ``openvino``
(raw), ``onnxruntime``, ``sdcpp`` (stable-diffusion.cpp; see sdcpp_worker.py for how each of its
numbers is taken).

Each (engine, case) runs in its own process, so peak RSS is that engine's alone; with
``--rounds`` > 1 every case is measured again in new processes, the engine order rotated, and
the runs pooled (the machine is shared: interleaving spreads the other jobs' load over all
engines). Printed per case: median and min seconds of all runs, compile (load + compile)
seconds, peak RSS, ratios to the fastest engine and to onnxruntime, and each engine's output
against onnxruntime's (relative L2 and max |diff|). Everything, with the machine (CPU model,
flags, load average) and versions, is written as JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402

ONNX_ENGINES = ("ggml-fp32", "ggml-fp16", "ggml-q8_0", "sdkit-openvino", "openvino", "onnxruntime")
ENGINES = (*ONNX_ENGINES, "sdcpp")
CASES = ("vae128", "vae256", "vae512", "unet256", "unet512", "taef2", "txt2img")
SDCPP_MODE = {"vae256": "vae256", "vae512": "unet512", "unet512": "unet512", "txt2img": "txt2img"}


def run_process(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}, no output"]
        return {"error": tail[0][:200]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def split_engine(engine: str, libs: dict[str, str]) -> tuple[str, dict[str, str] | None]:
    """``ggml-fp32@NAME`` -> (``ggml-fp32``, an environment loading the ggml build NAME)."""
    base, _, lib = engine.partition("@")
    if not lib:
        return base, None
    env = dict(os.environ)
    env["SDKIT_GGML_LIB_DIR"] = libs[lib]
    return base, env


def onnx_measure(engine: str, case: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    engine, env = split_engine(engine, args.ggml_libs)
    command = [sys.executable, str(HERE / "worker.py"), "--engine", engine, "--case", case,
               "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--threads", str(args.threads),
               "--outputs", str(out)]  # fmt: skip
    return run_process(command, env)


def sdcpp_measure(mode: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "sdcpp_worker.py"), "--mode", mode, "--repeat", str(args.repeat),
               "--warmup", str(args.warmup), "--threads", str(args.threads), "--steps", str(args.steps),
               "--outputs", str(out)]  # fmt: skip
    return run_process(command)


class Collected:
    """Runs pooled per (case, engine) over rounds."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, case: str, engine: str, times: list[float], compile_s: float, rss: float, out: Path | None) -> None:
        entry = self.entries.setdefault(
            (case, engine), {"case": case, "engine": engine, "times": [], "compile_s": [], "peak_rss_mb": 0.0}
        )
        entry["times"] += times
        entry["compile_s"].append(compile_s)
        entry["peak_rss_mb"] = max(entry["peak_rss_mb"], rss)
        if out is not None:
            entry["_out"] = out

    def error(self, case: str, engine: str, text: str) -> None:
        self.entries.setdefault((case, engine), {"case": case, "engine": engine})["error"] = text


def measure_round(cases: list[str], engines: list[str], rotation: int, args: argparse.Namespace, tmp: Path,
                  got: Collected, sdcpp_raw: list[dict[str, Any]]) -> None:  # fmt: skip
    order = engines[rotation % len(engines) :] + engines[: rotation % len(engines)]
    sdcpp_done: set[str] = set()
    for case in cases:
        for engine in order:
            if engine == "sdcpp":
                mode = SDCPP_MODE.get(case)
                if mode is None or mode in sdcpp_done:
                    continue
                sdcpp_done.add(mode)
                out = tmp / f"sdcpp-{mode}-{rotation}.npz"
                print(f"  [{time.strftime('%H:%M:%S')}] sdcpp {mode}", file=sys.stderr, flush=True)
                result = sdcpp_measure(mode, args, out)
                add_sdcpp(result, mode, got, out)
                sdcpp_raw.append(result)
                continue
            if case == "txt2img":
                continue
            out = tmp / f"{engine}-{case}-{rotation}.npz"
            print(f"  [{time.strftime('%H:%M:%S')}] {engine} {case}", file=sys.stderr, flush=True)
            result = onnx_measure(engine, case, args, out)
            if "error" in result:
                got.error(case, engine, result["error"])
            else:
                got.add(case, engine, result["times"], result["compile_s"], result["peak_rss_mb"], out)
                if "weights_mb" in result:
                    got.entries[(case, engine)]["weights_mb"] = result["weights_mb"]


def add_sdcpp(result: dict[str, Any], mode: str, got: Collected, out: Path) -> None:
    targets = {"vae256": [("vae256", "decode")], "unet512": [("unet512", "sampling"), ("vae512", "decode")],
               "txt2img": [("txt2img", "generate")]}[mode]  # fmt: skip
    for case, stage in targets:
        if "error" in result:
            got.error(case, "sdcpp", result["error"])
            continue
        times = [run[stage] for run in result["runs"] if stage in run]
        if not times:
            got.error(case, "sdcpp", f"no '{stage}' timing in sd.cpp's log")
            continue
        got.add(case, "sdcpp", times, result["load_s"], result["peak_rss_mb"], out if case == "vae256" else None)
        got.entries[(case, "sdcpp")]["stages"] = result["runs"]


def compare_outputs(got: Collected) -> None:
    """Each engine's outputs against onnxruntime's on the same case."""
    for (case, engine), entry in got.entries.items():
        peer = got.entries.get((case, "onnxruntime"), {})
        if "_out" not in entry or "_out" not in peer or engine == "onnxruntime":
            continue
        want = dict(np.load(peer["_out"]))
        mine = dict(np.load(entry["_out"]))
        if engine == "sdcpp":  # an 8-bit image in [0, 1]: compare with ort's decode mapped the same way
            ref = np.clip((next(iter(want.values())).astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
            diff = np.abs(mine["image01"].astype(np.float64) - ref)
            entry["max_diff"] = float(diff.max())
            entry["mean_diff"] = float(diff.mean())
            entry["rel_l2"] = float(np.linalg.norm(diff) / np.linalg.norm(ref))
            continue
        diffs, rels = [], []
        for name, ref in want.items():
            got_value = mine[name].astype(np.float64)
            diffs.append(float(np.max(np.abs(got_value - ref))))
            rels.append(float(np.linalg.norm(got_value - ref) / max(np.linalg.norm(ref), 1e-30)))
        entry["max_diff"], entry["rel_l2"] = max(diffs), max(rels)


def summarise(got: Collected) -> list[dict[str, Any]]:
    rows = []
    for entry in got.entries.values():
        row = {k: v for k, v in entry.items() if not k.startswith("_")}
        if entry.get("times"):
            row["median_s"] = statistics.median(entry["times"])
            row["min_s"] = min(entry["times"])
            row["compile_s"] = statistics.median(entry["compile_s"])
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(c for c in CASES if c != "vae128"))  # vae128: quick loops only
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per process (>= 5 for quoting)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="measure everything this many times, interleaved")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="txt2img sampling steps (cfg 7: two UNet runs each)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/<time>.json)")
    parser.add_argument("--compare", type=Path, default=None, help="an earlier results JSON to compare with")
    parser.add_argument("--ggml-lib", action="append", default=[], metavar="NAME=DIR",
                        help="a ggml build (SDKIT_GGML_LIB_DIR): engines ggml-fp32@NAME, ggml-fp16@NAME")  # fmt: skip
    args = parser.parse_args()
    args.ggml_libs = dict(item.split("=", 1) for item in args.ggml_lib)
    cases = [c for c in args.cases.split(",") if c]
    engines = [e for e in args.engines.split(",") if e]
    known = {*ENGINES, *(f"{e}@{lib}" for e in ONNX_ENGINES if e.startswith("ggml") for lib in args.ggml_libs)}
    unknown = [x for x in cases if x not in CASES] + [x for x in engines if x not in known]
    if unknown:
        parser.error(f"unknown case or engine: {', '.join(unknown)}")
    if "sdcpp" in engines and importlib.util.find_spec("stable_diffusion_cpp") is None:
        print("stable-diffusion-cpp-python is not installed: skipping sdcpp (see README)", file=sys.stderr)
        engines.remove("sdcpp")
    info = machine.describe()
    print(machine.headline(info), file=sys.stderr, flush=True)
    got, sdcpp_raw = Collected(), []
    with tempfile.TemporaryDirectory() as tmp:
        for rotation in range(args.rounds):
            measure_round(cases, engines, rotation, args, Path(tmp), got, sdcpp_raw)
        try:
            compare_outputs(got)
        except Exception as exc:  # keep the timings even when outputs cannot be compared
            print(f"comparing outputs failed: {exc}", file=sys.stderr)
    info["load_after"] = machine.load_average()
    rows = summarise(got)
    report = {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}, "results": rows,
              "sdcpp": [{k: v for k, v in r.items() if k != "runs"} for r in sdcpp_raw]}  # fmt: skip
    out = args.out or HERE / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))  # first: a failing printer must not lose the run
    import report as printer

    print(printer.render(report, args.steps))
    if args.compare:
        print(printer.compare(rows, json.loads(args.compare.read_text())["results"]))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
