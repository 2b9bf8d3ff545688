"""Coverage-guided fuzzing (atheris / libFuzzer) of the readers of untrusted input, the targets
of ``sdkit.testing.fuzz``, each in its own process for ``--seconds``, from the committed seed
corpus. A target that raises anything but an ``SdkitError``, or dies, is a crash: libFuzzer
saves the input under ``--crashes``. Figures go to ``tools/FUZZING.md`` with ``--record``.

    pip install atheris
    python tools/fuzz.py --seconds 60 --record          # all targets
    python tools/fuzz.py onnx --seconds 600             # one, longer
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "packages" / "sdkit-core" / "tests" / "data" / "fuzz"
RECORD = ROOT / "tools" / "FUZZING.md"


def child(target: str, argv: list[str]) -> None:
    """In the fuzzing process: instrument sdkit and the parsers it calls, then fuzz."""
    import atheris

    with atheris.instrument_imports(include=["sdkit", "numpy.lib.format", "onnx", "safetensors"]):
        from sdkit.testing.fuzz import TARGETS, run_one

    function = TARGETS[target]
    atheris.Setup([sys.argv[0], *argv], lambda data: run_one(function, data))
    atheris.Fuzz()


def fuzz(target: str, seconds: int, crashes: Path) -> dict[str, object]:
    crashes.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"sdkit-fuzz-{target}-") as work:
        corpus = Path(work) / "corpus"
        shutil.copytree(CORPUS / target, corpus)
        argv = [
            str(corpus),
            f"-max_total_time={seconds}",
            f"-artifact_prefix={crashes}/{target}-",
            "-rss_limit_mb=4096",
            "-timeout=30",
            "-max_len=65536",
        ]
        start = time.perf_counter()
        env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
        done = subprocess.run(
            [sys.executable, __file__, "--child", target, *argv], capture_output=True, text=True, env=env, check=False
        )
        wall = time.perf_counter() - start
        runs = re.findall(r"Done (\d+) runs", done.stderr) or re.findall(r"#(\d+)\s", done.stderr)
        coverage = re.findall(r"cov: (\d+)", done.stderr)
        found = sorted(p.name for p in crashes.glob(f"{target}-*"))
        return {
            "target": target,
            "runs": int(runs[-1]) if runs else 0,
            "seconds": round(wall, 1),
            "coverage": int(coverage[-1]) if coverage else 0,
            "exit": done.returncode,
            "crashes": found,
            "tail": done.stderr.strip().splitlines()[-3:],
        }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return 0
    from sdkit.testing.fuzz import TARGETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(sorted(TARGETS))} (default: all)")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--crashes", type=Path, default=Path(tempfile.gettempdir()) / "sdkit-fuzz-crashes")
    parser.add_argument("--record", action="store_true", help=f"write the figures to {RECORD.name}")
    args = parser.parse_args()
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; targets: {', '.join(sorted(TARGETS))}")
    results = [fuzz(t, args.seconds, args.crashes) for t in (args.targets or sorted(TARGETS))]
    lines = ["| target | executions | seconds | coverage (edges) | crashes |", "| --- | ---: | ---: | ---: | --- |"]
    for r in results:
        crashes = ", ".join(r["crashes"]) or "0"  # type: ignore[arg-type]
        lines.append(f"| {r['target']} | {r['runs']} | {r['seconds']} | {r['coverage']} | {crashes} |")
        print(r, flush=True)
    table = "\n".join(lines)
    print(table)
    if args.record:
        head = RECORD.read_text().split("<!-- results -->")[0] if RECORD.is_file() else "# Fuzzing\n\n"
        RECORD.write_text(f"{head}<!-- results -->\n{table}\n")
    return 1 if any(r["crashes"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
