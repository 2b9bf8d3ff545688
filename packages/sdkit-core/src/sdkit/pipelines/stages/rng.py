"""The pipeline's random numbers: one documented stream per image, the same on every backend.

Image ``i`` of a request with seed ``s`` draws from ``numpy.random.Generator(numpy.random.PCG64(s + i))``
(so image ``i`` of a batch equals a single-image request with seed ``s + i``). Every draw is
``standard_normal(shape, dtype=numpy.float32)`` for that image's share of the batch, made on the CPU,
in this order:

1. img2img only: the VAE posterior sample (``mean + std * noise``), latent shape;
2. the initial noise, latent shape: txt2img's initial latents (before scaling by the scheduler's
   ``init_noise_sigma``), or the noise img2img adds to the encoded image at its first timestep;
3. per-step noise, latent shape, for each step of a sampler that asks for it (ancestral and SDE
   samplers), in step order.

Because the numbers never come from a backend, a seed gives the same image on every backend up to
the backends' floating-point differences. This is the same order diffusers draws in, which is how
the golden images of ``fixtures/tiny_pipeline`` are made.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sdkit.errors import InputError


def seed_list(seed: int, count: int) -> list[int]:
    """The per-image seeds ``seed, seed + 1, ...`` (wrapped into numpy's unsigned 64-bit range)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InputError(f"seed must be an integer, not {type(seed).__name__}")
    return [(int(seed) + i) % (1 << 64) for i in range(count)]


class NoiseStream:
    """Standard-normal float32 draws, one generator per image of the batch."""

    def __init__(self, seeds: Sequence[int]) -> None:
        self.seeds = list(seeds)
        self._generators = [np.random.Generator(np.random.PCG64(s)) for s in self.seeds]

    def normal(self, shape: Sequence[int]) -> np.ndarray:
        """A ``shape`` draw whose first axis is the batch: row ``i`` comes from image ``i``'s stream."""
        shape = tuple(int(d) for d in shape)
        if not shape or shape[0] != len(self._generators):
            raise InputError(f"noise shape {list(shape)} does not start with the batch size {len(self._generators)}")
        rows = [g.standard_normal((1, *shape[1:]), dtype=np.float32) for g in self._generators]
        return np.concatenate(rows, axis=0)

    __call__ = normal
