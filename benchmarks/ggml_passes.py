"""Each ggml graph pass on and off: sdkit-ggml fp32 with every pass, with none, and with each
pass left out, one process per variant (``worker.py`` under ``SDKIT_GGML_PASSES_OFF``), the
variants rotated over ``--rounds``.

    python benchmarks/ggml_passes.py --cases vae128,unet256 --repeat 3 --rounds 1 --threads 2

Prints per case and variant the median and min seconds, the ratio to "all passes on", compile
seconds, peak RSS and the output's relative L2 distance to the all-off output (the graph as
exported), plus the load average before and after.
"""

from __future__ import annotations

import argparse
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

from sdkit_ggml.compiler.passes import OFF_ENV, PASS_NAMES  # noqa: E402


def variants(names: list[str]) -> dict[str, str]:
    """label -> value of SDKIT_GGML_PASSES_OFF."""
    out = {"all on": "", "all off": "all"}
    out.update({f"without {name}": name for name in names})
    return out


def measure(case: str, off: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "worker.py"), "--engine", "ggml-fp32", "--case", case,
               "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--threads", str(args.threads),
               "--outputs", str(out)]  # fmt: skip
    env = {**os.environ, OFF_ENV: off}
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def rel_l2(a: Path, b: Path) -> float:
    with np.load(a) as x, np.load(b) as y:
        key = sorted(x.files)[0]
        want = y[key].astype(np.float64)
        return float(np.linalg.norm(x[key] - want) / max(np.linalg.norm(want), 1e-30))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="vae128")
    parser.add_argument("--passes", default=",".join(PASS_NAMES), help="passes to leave out one at a time")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    info = machine.describe()
    print(f"# ggml passes on/off: {machine.headline(info)}; load before {machine.load_average()}")
    chosen = variants([p for p in args.passes.split(",") if p])
    report: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            runs: dict[str, dict[str, Any]] = {label: {"times": [], "compile_s": [], "rss": 0.0} for label in chosen}
            labels = list(chosen)
            for round_ in range(args.rounds):
                order = labels[round_ % len(labels) :] + labels[: round_ % len(labels)]
                for label in order:
                    print(f"  [{time.strftime('%H:%M:%S')}] {case} {label}", file=sys.stderr, flush=True)
                    out = Path(tmp) / f"{case}-{label.replace(' ', '_')}.npz"
                    result = measure(case, chosen[label], args, out)
                    if "error" in result:
                        runs[label]["error"] = result["error"]
                        continue
                    runs[label]["times"] += result["times"]
                    runs[label]["compile_s"].append(result["compile_s"])
                    runs[label]["rss"] = max(runs[label]["rss"], result["peak_rss_mb"])
                    runs[label]["out"] = out
            report += table(case, runs)
    print(f"load after {machine.load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "rows": report}, indent=1))
    return 0


def table(case: str, runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    base = statistics.median(runs["all on"]["times"]) if runs["all on"]["times"] else float("nan")
    off_out = runs["all off"].get("out")
    print(f"\n## {case}\n")
    print("| variant | median s | min s | time / all on | compile s | peak RSS MB | rel-L2 vs all off |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for label, run in runs.items():
        if "error" in run or not run["times"]:
            print(f"| {label} | error: {run.get('error')} | | | | | |")
            continue
        median = statistics.median(run["times"])
        dist = rel_l2(run["out"], off_out) if off_out is not None else float("nan")
        row = {"case": case, "variant": label, "median_s": median, "min_s": min(run["times"]),
               "ratio": median / base, "compile_s": statistics.median(run["compile_s"]), "rss_mb": run["rss"],
               "rel_l2_vs_off": dist}  # fmt: skip
        rows.append(row)
        print(f"| {label} | {median:.3f} | {row['min_s']:.3f} | {row['ratio']:.3f} | {row['compile_s']:.1f} "
              f"| {run['rss']:.0f} | {dist:.1e} |")  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
