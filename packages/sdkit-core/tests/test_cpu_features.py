"""CPU features: read from the OS, capped by ONEDNN_MAX_CPU_ISA, shown by ``sdkit doctor``, and
keying CPU-dependent groups of conformance exclusion files."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdkit import cpu_features
from sdkit.cli.main import main
from sdkit.cpu_features import CpuInfo, cpu_info
from sdkit.testing import load_exclusions

EXCLUSIONS = """\
## always
^test_a_
## [cpu lacks avx512bw avx_ne_convert] wrong without native bf16
^test_b_
## [cpu has avx512bw, avx_ne_convert] wrong with native bf16
^test_c_
"""
AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
XEON = {*AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16"}


@pytest.fixture
def fresh_cpu_info() -> Iterator[None]:
    cpu_info.cache_clear()
    yield
    cpu_info.cache_clear()


def _patterns(tmp_path: Path, flags: set[str], text: str = EXCLUSIONS) -> list[str]:
    file = tmp_path / "exclusions.txt"
    file.write_text(text, encoding="utf-8")
    return [pattern for pattern, _ in load_exclusions(file, cpu_flags=flags)]


def test_groups_keyed_on_the_cpu(tmp_path: Path) -> None:
    assert _patterns(tmp_path, AVX2) == ["^test_a_", "^test_b_"]
    assert _patterns(tmp_path, XEON) == ["^test_a_", "^test_c_"]
    assert _patterns(tmp_path, {*AVX2, "avx_ne_convert"}) == ["^test_a_", "^test_c_"]  # "has": any of them


def test_a_bad_condition_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"3: expected '## \[cpu has\|lacks"):
        _patterns(tmp_path, AVX2, "## ok\nx\n## [gpu has cuda] nope\ny\n")
    with pytest.raises(ValueError, match="expected"):
        _patterns(tmp_path, AVX2, "## [cpu lacks avx2]\ny\n")  # the reason itself is missing


def test_this_machine(fresh_cpu_info: None) -> None:
    info = cpu_info()
    assert info.name and info.machine
    if sys.platform.startswith("linux") and info.machine in ("x86_64", "AMD64"):
        assert info.source == "/proc/cpuinfo" and info.has("sse2")
    assert info.describe().startswith(f"{info.name} ({info.machine})")


def test_onednn_cap_removes_the_flags_above_it(monkeypatch: pytest.MonkeyPatch, fresh_cpu_info: None) -> None:
    monkeypatch.setattr(cpu_features, "_read", lambda: ("Xeon", frozenset(XEON), "test", None))
    assert cpu_info().has("amx_bf16") and not cpu_info().isa_cap
    cpu_info.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    capped = cpu_info()
    assert capped.flags == AVX2 and capped.isa_cap == "AVX2"
    assert capped.describe() == (
        "Xeon (" + capped.machine + "): avx avx2 fma f16c; lacks avx512f avx512bw avx512_bf16 avx512_fp16 "
        "avx_ne_convert amx_bf16 amx_fp16 (capped by ONEDNN_MAX_CPU_ISA=AVX2)"
    )
    cpu_info.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu_info().flags == XEON - {"amx_tile", "amx_bf16"}


def test_a_source_that_knows_few_flags_claims_no_lack_it_cannot_see() -> None:
    info = CpuInfo(
        "Some CPU",
        "AMD64",
        frozenset({"avx", "avx2"}),
        "IsProcessorFeaturePresent",
        frozenset({"avx", "avx2", "avx512f"}),
    )
    assert info.describe() == "Some CPU (AMD64): avx avx2; lacks avx512f"


def test_doctor_prints_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cpu: "))
    assert line == f"cpu: {cpu_info().describe()}"
