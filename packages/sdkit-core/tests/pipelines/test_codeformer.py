"""CodeFormer on sdkit's backends against spandrel_extra_arches (``fixtures/faces/codeformer/make_goldens.py``).

A random-weight CodeFormer file is written here from the seeded values the fixture script fed
spandrel_extra_arches' module (their hash is checked), compiled by ``CodeFormerRestorer`` and run
on the same face at w = 0, 0.5 and 1. Compared with the module's ``forward(x, weight=w)[0]``:
the network's raw output (in its [-1, 1] scale) and the restored face in [0, 1] (A1111's clamp and
mapping), max |diff| <= 1e-3 on both. The tiny configuration's weights were chosen (seed) so that
the code lookup is far from a tie: its smallest top-1 minus top-2 logit gap is recorded in
``goldens.json`` and checked here to be at least 0.02, 1000 times the backends' logit error.

Measured (2-vCPU EPYC, shared): tiny, raw output max |diff| reference 6.9e-5, ggml 3.5e-5,
openvino 7.2e-5 over w = 0, 0.5, 1; v0.1.0 at full size (``-m slow``) ggml 2.6e-5, openvino
7.5e-5 (its random weights' smallest logit gap is 6.6e-4 on that face: no code flipped on
either backend, a flip would move the output by far more than 1e-3).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from sdkit.errors import InputError, ModelFormatError, NonFiniteError
from sdkit.families.codeformer import V010, CodeFormerFile, find_graph, sniff
from sdkit.pipelines.stages.codeformer import CodeFormerRestorer
from sdkit.testing.assets import load_module_file
from sdkit.testing.goldens import require_backend as available

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "codeformer"
GOLDENS: dict[str, Any] = json.loads((FIXTURES / "goldens.json").read_text())["cases"]
TOLERANCE = 1e-3
FIDELITIES = (0.0, 0.5, 1.0)


def _weights_module() -> Any:
    return load_module_file(FIXTURES / "codeformer_weights.py", "codeformer_weights")


WEIGHTS = _weights_module()


def case_values(case: str) -> dict[str, np.ndarray]:
    facts = GOLDENS[case]
    values: dict[str, np.ndarray] = WEIGHTS.random_values([(k, s) for k, s in facts["entries"]], facts["seed"])
    assert WEIGHTS.values_hash(values) == facts["values_sha256"]
    return values


def write_case(case: str, folder: Path, prefix: str = "") -> Path:
    path = folder / f"{case}.safetensors"
    save_file({prefix + k: v for k, v in case_values(case).items()}, str(path))
    return path


def golden(case: str, w: float) -> np.ndarray:
    with np.load(FIXTURES / "goldens.npz") as data:
        return np.asarray(data[f"{case}.output_{w}"])


def tiny_face() -> np.ndarray:
    with np.load(FIXTURES / "goldens.npz") as data:
        return np.asarray(data["tiny.input"])


def restorer(path: Path, backend: str) -> CodeFormerRestorer:
    options = {"threads": 1} if backend == "ggml" else {}
    return CodeFormerRestorer(path, backend=backend, graphs=[FIXTURES / "tiny"], **options)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_case("tiny", tmp_path_factory.mktemp("codeformer"), prefix="params_ema.")


def test_the_tiny_goldens_are_far_from_a_code_tie() -> None:
    facts = GOLDENS["tiny"]
    assert facts["min_logit_gap"] >= 0.02
    assert len(set(facts["codes"])) > 1  # the lookup picks different codes per token
    assert min(facts["fraction_inside"].values()) > 0.2  # not all clamped away


@pytest.mark.parametrize("backend", ["reference", "ggml", "openvino"])
def test_tiny_codeformer_matches_spandrel(backend: str, tiny_file: Path) -> None:
    available(backend)
    net = restorer(tiny_file, backend)
    assert net.size == 64 and net.takes_fidelity and net.name == "CodeFormer"
    face = tiny_face()
    raws = {}
    for w in FIDELITIES if backend != "reference" else (0.0, 1.0):  # onnx.reference: 2-6 s a run
        want = golden("tiny", w)
        raws[w] = net.raw(face, w)
        diff = float(np.abs(raws[w] - want).max())
        print(f"{backend} w={w}: raw max |diff| vs spandrel {diff:.2e}")
        assert raws[w].shape == want.shape and diff <= TOLERANCE
    restored = net.restore(face)  # None is A1111's default, 0.5
    want_face = ((np.clip(golden("tiny", 0.5), -1, 1) + 1) / 2)[0].transpose(1, 2, 0)
    face_diff = float(np.abs(restored - want_face).max())
    print(f"{backend} restored face (w None): max |diff| vs spandrel + A1111's tensor2img {face_diff:.2e}")
    assert restored.shape == (64, 64, 3) and restored.dtype == np.float32 and face_diff <= TOLERANCE
    if 0.5 in raws:
        assert np.array_equal(restored, ((np.clip(raws[0.5], -1, 1) + 1) * np.float32(0.5))[0].transpose(1, 2, 0))
    assert float(restored.min()) >= 0.0 and float(restored.max()) <= 1.0


def test_fidelity_zero_leaves_out_the_encoder_features_exactly(tmp_path: Path) -> None:
    """spandrel skips the fuse blocks when w == 0; the graph multiplies their residual by w:
    other fuse weights change nothing, bit for bit, at w = 0 (and do change w = 0.5). On ggml
    (one thread: the same sums in the same order on both files)."""
    values = case_values("tiny")
    other = {k: (v * 3 if k.startswith("fuse_convs_dict.") else v) for k, v in values.items()}
    save_file(values, str(tmp_path / "a.safetensors"))
    save_file(other, str(tmp_path / "b.safetensors"))
    available("ggml")
    a, b = restorer(tmp_path / "a.safetensors", "ggml"), restorer(tmp_path / "b.safetensors", "ggml")
    face = tiny_face()
    assert np.array_equal(a.raw(face, 0.0), b.raw(face, 0.0))
    assert not np.array_equal(a.raw(face, 0.5), b.raw(face, 0.5))


def test_bad_faces_and_fidelities_are_input_errors(tiny_file: Path) -> None:
    net = restorer(tiny_file, "reference")
    face = tiny_face()
    for w in (-0.01, 1.01, float("nan"), float("inf"), "0.5", True, [0.5]):
        with pytest.raises(InputError, match="fidelity"):
            net.restore(face, w)  # type: ignore[arg-type]
    nan = np.where(face > 0.5, np.nan, face)
    bad = [face * 1.5, face - 0.5, nan, face[:32], face[..., :2], (face * 255).astype(np.uint8)]
    for one in bad[:3]:
        with pytest.raises(InputError, match="CodeFormer face"):
            net.restore(one.astype(np.float32))
    for one in bad[3:5]:
        with pytest.raises(InputError, match=r"\(64, 64, 3\)"):
            net.restore(one)
    with pytest.raises(InputError, match=r"in \[0, 1\]"):
        net.restore(bad[5])  # 8-bit pixels: 0..255 is out of range


def test_non_finite_weights_are_reported(tmp_path: Path) -> None:
    values = case_values("tiny")
    available("ggml")
    values["generator.blocks.0.bias"] = values["generator.blocks.0.bias"] * np.float32("nan")
    save_file(values, str(tmp_path / "nan.safetensors"))
    with pytest.raises(NonFiniteError, match="CodeFormer"):
        restorer(tmp_path / "nan.safetensors", "ggml").restore(tiny_face())


class _Marker:
    """Unpickling this would create the file named in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def test_pth_is_refused_unread_with_the_conversion_command(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    path = tmp_path / "codeformer-v0.1.0.pth"
    path.write_bytes(pickle.dumps({"params_ema": _Marker(str(marker))}))
    for load in (CodeFormerFile, lambda p: CodeFormerRestorer(p, backend="reference")):
        with pytest.raises(ModelFormatError) as info:
            load(path)
        message = str(info.value)
        assert "weights_only=True" in message and "params_ema" in message
        assert "codeformer-v0.1.0.safetensors" in message
    assert not marker.exists()


def test_a_file_that_does_not_fit_its_graph_names_the_tensor(tmp_path: Path) -> None:
    values = case_values("tiny")
    values["feat_emb.bias"] = values["feat_emb.bias"][:-1]
    values["extra.weight"] = np.zeros(3, np.float32)
    save_file(values, str(tmp_path / "odd.safetensors"))
    with pytest.raises(ModelFormatError, match=r"feat_emb\.bias.*|extra\.weight"):
        restorer(tmp_path / "odd.safetensors", "reference")
    fewer = {k: v for k, v in case_values("tiny").items() if not k.startswith("ft_layers.1.")}
    save_file(fewer, str(tmp_path / "one_layer.safetensors"))
    with pytest.raises(ModelFormatError, match=r"no graph for CodeFormer 64 px .* 1 layers"):
        restorer(tmp_path / "one_layer.safetensors", "reference")
    save_file({"conv_first.weight": np.zeros((4, 3, 3, 3), np.float32)}, str(tmp_path / "esrgan.safetensors"))
    with pytest.raises(ModelFormatError, match="not a CodeFormer file"):
        CodeFormerFile(tmp_path / "esrgan.safetensors")


def test_the_shipped_graph_is_v010_with_its_state_dict() -> None:
    """The shipped graph's initializers are v0.1.0's state dict, as spandrel's loader built it
    in the fixture script (names and shapes), and it takes ``w`` as an input."""
    graph = find_graph(V010)
    inits = {t.name: list(t.dims) for t in graph.proto.graph.initializer}
    assert inits == dict(GOLDENS["full_v010"]["entries"])
    assert [i.name for i in graph.inputs] == ["image", "w"]
    assert sniff(dict(GOLDENS["full_v010"]["entries"])) == V010


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ggml", "openvino"])
def test_full_size_v010_matches_spandrel(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """v0.1.0's configuration (94.1M random parameters, 376 MB file with ``params_ema.`` keys,
    detected by spandrel's own loader in the fixture script) on a 512 px face at w = 0, 0.5, 1;
    the goldens hold every 8th pixel of spandrel's output. Not on the reference backend:
    onnx.reference's Conv ran the tiny graph's 0.58 GMAC of convolutions at ~0.13 GMAC/s, and
    v0.1.0 at 512 px has 399 GMAC (about 50 minutes)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("full-size CodeFormer (minutes on 2 cores): pytest -m slow")
    available(backend)
    facts = GOLDENS["full_v010"]
    path = write_case("full_v010", tmp_path, prefix="params_ema.")
    options = {"threads": 2} if backend == "ggml" else {}
    net = CodeFormerRestorer(path, backend=backend, **options)
    assert net.config == V010 and net.size == 512
    face = np.random.default_rng(1000 + facts["input_seed"]).random((512, 512, 3), dtype=np.float32)
    stride = facts["stride"]
    for w in FIDELITIES:
        want = golden("full_v010", w)
        raw = net.raw(face, w)[:, :, ::stride, ::stride]
        diff = float(np.abs(raw - want).max())
        print(f"full v0.1.0 {backend} w={w}: raw max |diff| {diff:.2e}")
        assert diff <= TOLERANCE
