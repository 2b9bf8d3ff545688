"""Face restoration's files and wiring: sniffing dispatch, the face folder, ``.pth`` refusal,
``sdkit.restore_faces``, ``sdkit restore-faces``, ``GenerationRequest.restore_faces``.

The networks (``sdkit.families.gfpgan`` / ``codeformer`` / ``retinaface`` / ``parsenet`` and their
stages) are stood in for by modules injected here that follow the faces contract, with the
fixture's fixed detector, restorer and parser (``fixtures/faces/pipeline/``): what is tested is
the dispatch and the wiring, and the restored pixels equal what ``faces.restore_faces`` gives
with the same stand-ins (itself held to facexlib in ``test_faces.py``). The networks' own
end-to-end test lands with them.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save_file

import sdkit
from sdkit.cli.main import main
from sdkit.cli.restore_faces import face_fields
from sdkit.errors import InputError, MissingDependencyError, ModelFormatError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.stages import faces

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "faces" / "pipeline"
GFPGAN_KEY, CODEFORMER_KEY = "stylegan_decoder.final_conv.weight", "quantize.embedding.weight"


@pytest.fixture(scope="module")
def face_golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "pipeline.npz") as data:
        out = {k: data[k] for k in data.files}
    for name in ("image", "out_parse", "out_square", "parse_map"):
        out[name] = np.asarray(Image.open(FIXTURES / f"{name}.png"))
    return out


class FakeDetector:
    """The fixture's faces when the image is the fixture's; else one face in the middle."""

    def __init__(self, path: Path, backend: str = "auto", device: str | None = None) -> None:
        with np.load(FIXTURES / "pipeline.npz") as data:
            self.landmarks = data["detector_landmarks"]
        self.path, self.backend = path, backend

    def detect(self, image: np.ndarray, conf_threshold: float = 0.97, nms_threshold: float = 0.4) -> list[Any]:
        face = types.SimpleNamespace(box=(0.0, 0.0, 1.0, 1.0), score=0.999)
        if image.shape[:2] == (819, 640):
            return [types.SimpleNamespace(**vars(face), landmarks=lm) for lm in self.landmarks]
        side = min(image.shape[:2])
        centred = (faces.FACE_TEMPLATE - 256) * (side / 900) + np.array(image.shape[1::-1]) / 2
        return [types.SimpleNamespace(**vars(face), landmarks=centred.astype(np.float32))]


class FakeParser:
    size = 512

    def __init__(self, path: Path, backend: str = "auto", device: str | None = None) -> None:
        self.classes = np.asarray(Image.open(FIXTURES / "parse_map.png")).astype(np.int64)

    def parse(self, face: np.ndarray) -> np.ndarray:
        return self.classes


class FakeGFPGAN:
    name, size, takes_fidelity = "GFPGAN", 512, False

    def __init__(self, path: Path, backend: str = "auto", device: str | None = None) -> None:
        self.path = path

    def restore(self, face: np.ndarray, fidelity: float | None = None) -> np.ndarray:
        if fidelity is not None:
            raise InputError("GFPGAN has no fidelity weight")
        return np.clip(face * np.float32(0.8) + np.float32(0.1), 0, 1).astype(np.float32)


class FakeCodeFormer(FakeGFPGAN):
    name, takes_fidelity = "CodeFormer", True
    seen: ClassVar[list[float | None]] = []

    def restore(self, face: np.ndarray, fidelity: float | None = None) -> np.ndarray:
        self.seen.append(fidelity)
        w = 0.5 if fidelity is None else fidelity
        return np.clip(face * np.float32(w), 0, 1).astype(np.float32)


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


@pytest.fixture
def networks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The four parts of the contract, as stand-ins."""

    def sniffer(key: str) -> Any:
        return lambda shapes: {"key": key} if key in shapes else None

    stand_ins = {
        "sdkit.families.gfpgan": _module("gfpgan", sniff=sniffer(GFPGAN_KEY)),
        "sdkit.families.codeformer": _module("codeformer", sniff=sniffer(CODEFORMER_KEY)),
        "sdkit.families.retinaface": _module("retinaface", sniff=sniffer("body.conv1.weight")),
        "sdkit.families.parsenet": _module("parsenet", sniff=sniffer("encoder.0.weight")),
        "sdkit.pipelines.stages.gfpgan": _module("gfpgan_stage", GFPGANRestorer=FakeGFPGAN),
        "sdkit.pipelines.stages.codeformer": _module("codeformer_stage", CodeFormerRestorer=FakeCodeFormer),
        "sdkit.pipelines.stages.retinaface": _module("retinaface_stage", RetinaFaceDetector=FakeDetector),
        "sdkit.pipelines.stages.parsenet": _module("parsenet_stage", ParseNetParser=FakeParser),
    }
    for name, module in stand_ins.items():
        monkeypatch.setitem(sys.modules, name, module)
    faces._LOADED.clear()
    yield
    faces._LOADED.clear()


def _file(path: Path, key: str) -> Path:
    save_file({key: np.zeros((2, 3), dtype=np.float32), "other.bias": np.zeros(2, dtype=np.float32)}, str(path))
    return path


@pytest.fixture
def face_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A1111's file names in a folder named by ``$SDKIT_FACE_DIR``."""
    folder = tmp_path / "faces"
    folder.mkdir()
    _file(folder / "GFPGANv1.4.safetensors", GFPGAN_KEY)
    _file(folder / "codeformer-v0.1.0.safetensors", CODEFORMER_KEY)
    _file(folder / "detection_Resnet50_Final.safetensors", "body.conv1.weight")
    _file(folder / "parsing_parsenet.safetensors", "encoder.0.weight")
    monkeypatch.setenv(faces.FACE_DIR_ENV, str(folder))
    return folder


def test_sniffing_dispatches_by_tensors(networks: None, face_dir: Path, tmp_path: Path) -> None:
    assert faces.sniff_face_restorer(face_dir / "GFPGANv1.4.safetensors") == "GFPGAN"
    assert faces.sniff_face_restorer(face_dir / "codeformer-v0.1.0.safetensors") == "CodeFormer"
    renamed = _file(tmp_path / "mystery.safetensors", CODEFORMER_KEY)  # the name does not matter
    assert isinstance(faces.open_face_restorer(renamed), FakeCodeFormer)
    with pytest.raises(ModelFormatError, match="neither a GFPGAN nor a CodeFormer"):
        faces.sniff_face_restorer(face_dir / "detection_Resnet50_Final.safetensors")


def test_pickles_and_missing_files_are_refused(networks: None, tmp_path: Path) -> None:
    pth = tmp_path / "GFPGANv1.4.pth"
    pth.write_bytes(b"\x80\x04not read")
    with pytest.raises(
        ModelFormatError, match=r"refused.*torch.load\('GFPGANv1.4.pth'.*weights_only=True.*GFPGANv1.4.safetensors"
    ):
        faces.open_face_restorer(pth)
    with pytest.raises(ModelFormatError, match="refused"):
        faces.open_face_detector(tmp_path / "detection_Resnet50_Final.pth")
    wrong = _file(tmp_path / "detection_Resnet50_Final.safetensors", GFPGAN_KEY)
    with pytest.raises(ModelFormatError, match=r"not a RetinaFace .*sdkit\.families\.retinaface\.sniff declined"):
        faces.open_face_detector(wrong)
    with pytest.raises(ModelFormatError, match="not a ParseNet"):
        faces.open_face_parser(wrong)
    with pytest.raises(ModelFormatError, match="not found"):
        faces.open_face_restorer(tmp_path / "nothing.safetensors")


def test_folder_lookup_by_a1111_names(
    networks: None, face_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = faces.load_face_models("CodeFormer")
    assert models.name == "CodeFormer" and isinstance(models.parser, FakeParser)
    assert faces.load_face_models("codeformer") is models  # compiled once, reused
    assert faces.load_face_models("GFPGAN", use_parse=False).parser is None
    (face_dir / "parsing_parsenet.safetensors").unlink()
    faces._LOADED.clear()
    with pytest.raises(InputError, match=r"parsing_parsenet\.safetensors: not found in .*faces"):
        faces.load_face_models("GFPGAN")
    monkeypatch.delenv(faces.FACE_DIR_ENV)
    with pytest.raises(InputError, match=r"no codeformer-v0\.1\.0\.safetensors in no folder \(set \$SDKIT_FACE_DIR\)"):
        faces.load_face_models("CodeFormer")
    # next to the restorer counts as a face folder
    own = tmp_path / "own"
    own.mkdir()
    for name, key in (
        ("GFPGANv1.4", GFPGAN_KEY),
        ("detection_Resnet50_Final", "body.conv1.weight"),
        ("parsing_parsenet", "encoder.0.weight"),
    ):
        _file(own / f"{name}.safetensors", key)
    assert faces.load_face_models(own / "GFPGANv1.4.safetensors").name == "GFPGAN"


def test_missing_network_modules_are_named(monkeypatch: pytest.MonkeyPatch, face_dir: Path) -> None:
    monkeypatch.setitem(sys.modules, "sdkit.families.gfpgan", None)  # importing it fails
    faces._LOADED.clear()
    with pytest.raises(MissingDependencyError, match=r"sdkit\.families\.gfpgan"):
        faces.sniff_face_restorer(face_dir / "GFPGANv1.4.safetensors")


def test_public_api_and_cli(
    networks: None,
    face_dir: Path,
    face_golden: dict[str, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = tmp_path / "in.png"
    Image.fromarray(face_golden["image"]).save(source)
    restored = sdkit.restore_faces(source, "GFPGAN")
    expected, count = faces.restore_faces(
        face_golden["image"], FakeGFPGAN(Path()), FakeDetector(Path()), FakeParser(Path())
    )
    assert count == 2 and np.array_equal(np.asarray(restored), np.asarray(expected))
    assert np.abs(np.asarray(restored).astype(int) - face_golden["out_parse"]).max() <= 1
    out = tmp_path / "out.png"
    assert (
        main(
            [
                "restore-faces",
                str(source),
                "--model",
                "CodeFormer",
                "--fidelity",
                "0.7",
                "--visibility",
                "0.5",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "2 face(s) restored with CodeFormer" in capsys.readouterr().out
    assert FakeCodeFormer.seen[-1] == 0.7
    assert not np.array_equal(np.asarray(Image.open(out)), face_golden["image"])
    assert (
        main(["restore-faces", str(source), "--model", "GFPGAN", "--fidelity", "0.7", "-o", str(tmp_path / "x.png")])
        == 1
    )
    assert "GFPGAN has no fidelity weight" in capsys.readouterr().err
    assert main(["restore-faces", str(source), "--model", "GFPGAN", "-o", str(out)]) == 1  # exists
    assert (
        main(["restore-faces", str(source), "--model", "GFPGAN", "--threads", "2", "-o", str(tmp_path / "y.png")]) == 1
    )
    assert "backend options" in capsys.readouterr().err


def test_request_fields_are_checked() -> None:
    assert GenerationRequest.create("a face", restore_faces=Path("x.safetensors")).restore_faces == "x.safetensors"
    with pytest.raises(InputError, match="codeformer_weight needs restore_faces"):
        GenerationRequest.create("a face", codeformer_weight=0.5)
    with pytest.raises(InputError, match=r"codeformer_weight must be in \[0, 1\]"):
        GenerationRequest.create("a face", restore_faces="CodeFormer", codeformer_weight=1.5)
    with pytest.raises(InputError, match="restore_faces must be"):
        GenerationRequest.create("a face", restore_faces=3)
    flags = argparse.Namespace(restore_faces=None, codeformer_weight=0.3)
    with pytest.raises(InputError, match="--codeformer-weight needs --restore-faces"):
        face_fields(flags)
    flags.restore_faces = "CodeFormer"
    assert face_fields(flags) == {"restore_faces": "CodeFormer", "codeformer_weight": 0.3}


def _delivered(pipe: Any, pixels: np.ndarray, **fields: Any) -> Any:
    """What ``pipe.run`` does around the denoiser for a request: plan, then deliver ``pixels``."""
    plan = pipe.plan(pipe.accept(GenerationRequest.create("a face", seed=3, steps=2, num_images=len(pixels), **fields)))
    return plan, pipe.deliver(plan, pixels)


def test_generation_restores_faces_before_the_png(networks: None, face_dir: Path, reference_pipe: Any) -> None:
    pixels = np.random.default_rng(0).random((2, 64, 64, 3), dtype=np.float32)
    _, plain = _delivered(reference_pipe, pixels)
    plan, fixed = _delivered(reference_pipe, pixels, restore_faces="GFPGAN")
    assert plan.parameters["Face restoration"] == "GFPGAN"
    for before, after in zip(plain, fixed, strict=True):
        expected, count = faces.restore_faces(before, FakeGFPGAN(Path()), FakeDetector(Path()), FakeParser(Path()))
        assert count == 1 and np.array_equal(np.asarray(after), np.asarray(expected))
        assert not np.array_equal(np.asarray(after), np.asarray(before))
        assert "Face restoration: GFPGAN" in after.info["parameters"]
        assert "Face restoration" not in before.info["parameters"]
    _, arrays = _delivered(reference_pipe, pixels, restore_faces="CodeFormer", codeformer_weight=0.2, output_type="np")
    assert FakeCodeFormer.seen[-1] == 0.2 and arrays.dtype == np.float32 and arrays.shape == pixels.shape
    with pytest.raises(InputError, match="GFPGAN has no fidelity weight"):  # refused at plan, before denoising
        _delivered(reference_pipe, pixels, restore_faces="GFPGAN", codeformer_weight=0.2)


def test_faces_are_restored_before_the_inpainting_paste_back(
    networks: None, face_dir: Path, reference_pipe: Any
) -> None:
    """A1111 restores faces on the generated image, then lays its overlay (the paste-back)."""
    from sdkit.pipelines.features.inpainting import paste_back
    from sdkit.pipelines.imaging.images import float_to_pil

    rng = np.random.default_rng(1)
    pixels = rng.random((1, 64, 64, 3), dtype=np.float32)
    init = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    mask = np.zeros((64, 64), dtype=np.uint8)
    mask[:, 32:] = 255
    fields = {"init_image": init, "mask": mask, "paste_back": True, "output_type": "np"}
    plan, out = _delivered(reference_pipe, pixels, restore_faces="GFPGAN", **fields)
    restored, _ = faces.restore_faces(
        float_to_pil(pixels)[0], FakeGFPGAN(Path()), FakeDetector(Path()), FakeParser(Path())
    )
    expected = paste_back((np.asarray(restored, dtype=np.float32) / np.float32(255))[None], plan.mask.paste)
    assert np.array_equal(out, expected)
    _, unrestored = _delivered(reference_pipe, pixels, **fields)
    assert np.array_equal(out[:, :, :24], unrestored[:, :, :24])  # outside the mask: the original either way
    assert not np.array_equal(out, unrestored)


@pytest.mark.slow
def test_generate_with_restore_faces(networks: None, face_dir: Path, reference_pipe: Any) -> None:
    plain = reference_pipe.generate("a face", seed=3, steps=2)[0]
    fixed = reference_pipe.generate("a face", seed=3, steps=2, restore_faces="GFPGAN")[0]
    expected, count = faces.restore_faces(plain, FakeGFPGAN(Path()), FakeDetector(Path()), FakeParser(Path()))
    assert count == 1 and np.array_equal(np.asarray(fixed), np.asarray(expected))
    assert "Face restoration: GFPGAN" in fixed.info["parameters"]


NETWORKS = [
    ("gfpgan", "GFPGANRestorer", "face-gfpgan"),
    ("codeformer", "CodeFormerRestorer", "face-codeformer"),
    ("retinaface", "RetinaFaceDetector", "face-detect"),
    ("parsenet", "ParseNetParser", "face-detect"),
]


@pytest.mark.parametrize(("module", "cls", "branch"), NETWORKS)
def test_landed_networks_follow_the_contract(module: str, cls: str, branch: str) -> None:
    """Once a network lands, its stage class and family sniffer have the contract's shape, and
    the sniffer declines another architecture's keys without raising (the lead's end-to-end
    test on real files comes with the networks)."""
    stage = pytest.importorskip(
        f"sdkit.pipelines.stages.{module}", reason=f"sdkit.pipelines.stages.{module} has not landed ({branch})"
    )
    family = pytest.importorskip(
        f"sdkit.families.{module}", reason=f"sdkit.families.{module} has not landed ({branch})"
    )
    network = getattr(stage, cls)
    if module in ("gfpgan", "codeformer"):
        assert network.name == {"gfpgan": "GFPGAN", "codeformer": "CodeFormer"}[module]
        assert network.takes_fidelity is (module == "codeformer")
        assert callable(network.restore)
    elif module == "retinaface":
        assert callable(network.detect) and hasattr(stage, "DetectedFace")
    else:
        assert network.size == 512 and callable(network.parse)
    foreign = {"model.0.weight": (64, 3, 3, 3), "model.1.sub.0.RDB1.conv1.0.weight": (32, 64, 3, 3)}
    assert family.sniff(foreign) is None


def test_generate_flags_reach_the_request(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sdkit.load_pipeline", lambda *a, **k: pytest.fail("no model may load"))
    from sdkit.cli.generate import build_request
    from sdkit.cli.main import build_parser

    argv = [
        "generate",
        "a face",
        "--model",
        str(tiny_dir),
        "--restore-faces",
        "CodeFormer",
        "--codeformer-weight",
        "0.3",
    ]
    request = build_request(build_parser().parse_args(argv))
    assert (request.restore_faces, request.codeformer_weight) == ("CodeFormer", 0.3)
    with pytest.raises(InputError, match="--codeformer-weight needs --restore-faces"):
        build_request(
            build_parser().parse_args(["generate", "a", "--model", str(tiny_dir), "--codeformer-weight", "1"])
        )
