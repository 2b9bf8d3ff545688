"""sdkit-ggml tests use sdkit.testing's fixtures (taef2, sd_graphs, one_node...).

The suite checks the compiler against its oracles at CPU tolerances, so ggml's default device
is its CPU here even where ggml is built with a GPU backend (which ggml lists first): CUDA
computes F32 matrix products in TF32 (ggml-cuda sets cuBLAS's TF32 math mode) and has its own
approximations of tanh, erf..., about 1e-3 relative. Tests marked ``gpu`` (``test_gpu.py``)
check the GPU at its own tolerances.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cpu_first(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("gpu") is None:
        from sdkit_ggml.backend import GgmlBackend

        listed = GgmlBackend.devices
        monkeypatch.setattr(GgmlBackend, "devices", lambda self: sorted(listed(self), key=lambda d: d.kind != "cpu"))
