"""Draw the digits 0-9 with the repo's trained tiny_digits model and write them as one grid PNG.

    python examples/tiny_digits_grid.py [--backend auto] [--out out/digits_grid.png]

The model (``models/tiny-digits/tiny_digits.safetensors``, its model card beside it) loads like
any SD 1.x single-file checkpoint: ``sdkit.load_pipeline(file)``. Each cell is one prompt
("a handwritten digit zero" ... "nine") at the same seed, 32 px, shown enlarged.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from PIL import Image

import sdkit

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-digits" / "tiny_digits.safetensors"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--zoom", type=int, default=4, help="each 32 px cell enlarged this many times")
    parser.add_argument("--out", default="out/digits_grid.png")
    args = parser.parse_args()

    start = time.perf_counter()
    pipe = sdkit.load_pipeline(MODEL, backend=args.backend)
    cells = []
    for word in WORDS:
        [image] = pipe.generate(f"a handwritten digit {word}", seed=args.seed, steps=args.steps, guidance_scale=5.0)
        cells.append(image.convert("L"))
    pitch = cells[0].width + 2  # a 2 px white gap between cells
    grid = Image.new("L", (5 * pitch - 2, 2 * pitch - 2), 255)
    for i, cell in enumerate(cells):
        grid.paste(cell, ((i % 5) * pitch, (i // 5) * pitch))
    grid = grid.resize((grid.width * args.zoom, grid.height * args.zoom), Image.Resampling.NEAREST)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    grid.save(out)
    print(f"tiny_digits: 10 prompts at seed {args.seed}, {args.steps} steps, {time.perf_counter() - start:.1f} s")
    print(f"wrote {out} (top row 0-4, bottom row 5-9)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
