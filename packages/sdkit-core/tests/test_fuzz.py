"""Fuzzing of the readers of untrusted input (issue 15): the ONNX loader, the safetensors and
.npy readers, the tokenizer (prompts and its files) and the pipeline-folder reader. Each input
is either read or refused with an ``SdkitError``; any other exception fails the test.

In CI: every committed seed and regression as it is, then hypothesis mutations of the seeds
(byte flips, inserts, deletes, truncations, splices, interesting integers), derandomized so a
run is reproducible. ``tools/fuzz.py`` runs the same targets coverage-guided (atheris) for
longer; its figures are in ``tools/FUZZING.md``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdkit.testing.fuzz import TARGETS, run_one

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

CORPUS = Path(__file__).parent / "data" / "fuzz"
EXAMPLES = 120  # per target; about 2-10 s each on one core
_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1]


def _seeds(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).rglob("*") if p.is_file())


@st.composite
def _mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice", "integer"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            other = draw(st.sampled_from(seeds))
            start = draw(st.integers(0, max(len(other) - 1, 0)))
            data[at:at] = other[start : start + draw(st.integers(1, 256))]
        elif kind == "integer":
            value = draw(st.sampled_from(_INTERESTING)).to_bytes(8, "little")[: draw(st.sampled_from([1, 2, 4, 8]))]
            data[at : at + len(value)] = value
    return bytes(data)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_and_regressions(target: str) -> None:
    seeds = _seeds(target)
    assert seeds, f"no corpus for {target}"
    for path in seeds:
        run_one(TARGETS[target], path.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_mutations_are_read_or_refused(target: str) -> None:
    seeds = [p.read_bytes() for p in _seeds(target) if "regressions" not in p.parts]

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(_mutated(seeds))
    def fuzz(data: bytes) -> None:
        run_one(TARGETS[target], data)

    fuzz()
