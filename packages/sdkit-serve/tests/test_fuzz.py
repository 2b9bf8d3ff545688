"""Schemathesis against the running server's OpenAPI schema: whatever it generates (valid and
invalid bodies, query strings, headers), no response may be a 5xx. Bounded in examples and time.

Needs ``sdkit-serve[fuzz]``; marked ``fuzz``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_helpers import ServerProcess

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = 30  # per operation
MAX_TIME_S = 60  # the whole run: fuzzing repeats until it is spent


def test_schemathesis_finds_no_server_error(small_server: ServerProcess, tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st is None:
        pytest.skip("schemathesis is not installed (pip install sdkit-serve[fuzz])")
    command = [
        st, "run", f"{small_server.url}/openapi.json",
        "--checks", "not_a_server_error",
        "--max-examples", str(MAX_EXAMPLES),
        "--max-time", str(MAX_TIME_S),
        "--phases", "examples,coverage,fuzzing",
        "--workers", "1",
        "--seed", "20261123",
        "--request-timeout", "120",
        "--suppress-health-check", "all",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]  # fmt: skip
    start = time.monotonic()
    env = {**os.environ, "NO_COLOR": "1"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=MAX_TIME_S + 300, env=env, cwd=tmp_path)
    summary = "\n".join(run.stdout.splitlines()[-25:])
    print(f"schemathesis: {time.monotonic() - start:.0f} s, exit {run.returncode}\n{summary}")
    assert run.returncode == 0, f"schemathesis found problems:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    counts = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert counts is not None and int(counts[1]) == int(counts[2]) >= 100, "too few cases ran to mean anything"
