"""Requests too big for the memory budget are one clear error before anything is allocated
(issue 15, findings 7 and 8): image counts, sizes, ``--random`` shapes, init images that are
decompression bombs. Each ran until the OOM killer, or printed "internal error"."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from sdkit.cli.main import main
from sdkit.errors import InputError, ResourceLimitError
from sdkit.pipelines.imaging.images import open_init_image
from sdkit.testing.cli_output import without_progress


def _png_header(path: Path, width: int, height: int) -> Path:
    """A PNG that claims ``width`` x ``height`` pixels in 100 bytes (its pixels never decode)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    )
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--num-images", "1000000000"],  # grew past 2 GB building a list of output paths
        ["--width", "800000", "--height", "800000"],  # MemoryError: "internal error"
        ["--num-images", "100000", "--width", "4096", "--height", "4096"],  # overcommit, then OOM
    ],
)
def test_generation_over_the_budget_is_refused(
    flags: list[str], tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["generate", "-m", str(tiny_dir), "a", "--backend", "reference", "-o", str(tmp_path / "o.png"), *flags])
    err = without_progress(capsys.readouterr().err)
    assert code == 1 and err.startswith("sdkit: error:") and "over the memory budget" in err, err


def test_random_inputs_over_the_budget_are_refused(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unet = str(tiny_dir / "unet" / "model.onnx")
    code = main(["run", unet, "--backend", "reference", "--random", "sample=1x4x400000x400000"])
    err = capsys.readouterr().err
    assert code == 1 and "--random sample=1x4x400000x400000 needs" in err and "over the memory budget" in err, err


def test_init_image_bombs_are_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match=r"is not a readable image.*decompression bomb"):
        open_init_image(_png_header(tmp_path / "bomb.png", 100_000, 100_000))  # PIL's own limit
    monkeypatch.setenv("SDKIT_MEMORY_BUDGET", "100M")
    with pytest.raises(ResourceLimitError, match=r"init image .*big.png \(8000x8000\) needs"):
        open_init_image(_png_header(tmp_path / "big.png", 8000, 8000))  # under PIL's limit
