"""A full-size single-file checkpoint (LDM/SGM keys, fp16) of random weights, written from sdkit's
own family key maps: every initializer of the family's shipped graphs, stored under the key and
in the shape a civitai-style checkpoint has it (``Family.key_map(component, "ldm")``). Needs
numpy and sdkit only (no torch, no diffusers, no safetensors package), so the bare GPU machine
can write it.

Values: a fixed block of seeded normals tiled over each tensor, scaled by 1/sqrt(fan-in) for
matrices and convolutions; 1-D ``.weight`` tensors (the norm scales) are ones. Speed does not
depend on the values; the scaling keeps 20 CFG steps finite in fp16.

    python benchmarks/random_checkpoint.py sd1 /tmp/sd15_random.safetensors
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np

FORMAT = 1  # bump when the values written change: cached files carry it in their name
_BLOCK = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)


def stored_shapes(family_name: str) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> stored shape for every weight of ``family_name``'s components."""
    from sdkit.families.builtin import FAMILIES
    from sdkit.families.family import initializer_specs

    family = next(f for f in FAMILIES if f.name == family_name)
    shapes: dict[str, tuple[int, ...]] = {}
    for component, spec in family.components.items():
        graph_shapes = initializer_specs(spec.load_graph())
        for name, source in family.key_map(component, "ldm").items():
            shape = list(graph_shapes[name][0])
            if source.transpose:
                shape = shape[::-1]
            if source.reshape and len(shape) == 2:
                shape += [1, 1]  # the VAE attention's 1x1 convolutions, Linear in the graph
            if source.rows is not None:  # OpenCLIP's fused q/k/v: the rows of one tensor
                before = shapes.get(source.key, (0,))
                shape[0] = max(before[0], source.rows[1])
            shapes[source.key] = tuple(shape)
    return shapes


def values(key: str, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if len(shape) == 1 and key.endswith(".weight"):
        return np.ones(shape, np.float16)
    offset = (zlib.crc32(key.encode()) & 0xFFFF) if len(shape) > 1 else 0
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else 50
    block = np.roll(_BLOCK, offset)
    return (np.resize(block, count) / math.sqrt(fan_in)).astype(np.float16).reshape(shape)


def write(family_name: str, path: Path) -> Path:
    """Write (once: an existing file is reused) and return ``path``."""
    if path.is_file():
        return path
    shapes = stored_shapes(family_name)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "sdkit_benchmark": f"random {FORMAT}"}}
    offset = 0
    for key, shape in shapes.items():
        size = math.prod(shape) * 2
        header[key] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    partial = path.with_suffix(".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for key, shape in shapes.items():
            out.write(values(key, shape).tobytes())
    partial.replace(path)
    return path


if __name__ == "__main__":
    print(write(sys.argv[1], Path(sys.argv[2])))
