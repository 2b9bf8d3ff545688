"""Where ``sdkit generate`` writes its images, as AUTOMATIC1111 keeps them.

Without ``-o``: an output folder (``--outdir``; default ``outputs/txt2img`` or
``outputs/img2img``) of numbered files, ``00012-1234.png`` (the folder's next free number, then
the seed), never overwriting. With ``-o PATH``: exactly that file (``PATH-1.png``... for more
images), refused when it exists unless ``--force``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sdkit.errors import InputError

_NUMBERED = re.compile(r"^(\d+)-")


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        "-o",
        default=None,
        help="the PNG to write, exactly there (refused if it exists, unless --force; more images: NAME-1.png...); "
        "default: a numbered file in --outdir",
    )
    parser.add_argument(
        "--outdir",
        default=None,
        help="folder for numbered images, 00012-SEED.png, never overwriting (default: outputs/txt2img, "
        "outputs/img2img with --init-image)",
    )
    parser.add_argument("--force", action="store_true", help="let -o overwrite an existing file")


class OutputFiles:
    """The files one run writes, checked before any model loads."""

    def __init__(self, output: str | None, outdir: str | None, img2img: bool, force: bool, count: int) -> None:
        if output is not None and outdir is not None:
            raise InputError("give -o/--output (one file) or --outdir (numbered files), not both")
        self.base = Path(output) if output is not None else None
        self.folder = Path(outdir or ("outputs/img2img" if img2img else "outputs/txt2img"))
        self.force = force
        if self.base is not None:
            if self.base.suffix.lower() != ".png":
                raise InputError(f"the output must be a .png file, got {self.base}")
            for index in range(min(count, 1000)):  # a count over the budget is refused later by the pipeline
                self._refuse_existing(self.exact_path(index, count))
        elif self.folder.exists() and not self.folder.is_dir():
            raise InputError(f"--outdir {self.folder} is not a folder")

    def exact_path(self, index: int, count: int) -> Path:
        assert self.base is not None
        return self.base if count == 1 else self.base.with_name(f"{self.base.stem}-{index}{self.base.suffix}")

    def _refuse_existing(self, path: Path) -> None:
        if path.exists() and not self.force:
            raise InputError(f"{path} exists; pass --force to overwrite it, or leave out -o for a numbered file")

    def path(self, index: int, count: int, seed: int) -> Path:
        """Image ``index``'s file: ``-o``'s path, or the output folder's next free number."""
        if self.base is not None:
            path = self.exact_path(index, count)
            self._refuse_existing(path)  # appeared while generating
            return path
        return self.folder / f"{next_number(self.folder):05d}-{seed}.png"


def next_number(folder: Path) -> int:
    """One more than the highest ``NNNNN-`` prefix in ``folder`` (0 when there is none)."""
    if not folder.is_dir():
        return 0
    numbers = [int(match.group(1)) for entry in folder.iterdir() if (match := _NUMBERED.match(entry.name))]
    return max(numbers, default=-1) + 1
