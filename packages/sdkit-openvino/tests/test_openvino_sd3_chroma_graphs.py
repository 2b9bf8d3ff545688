"""The shipped full-size SD3 / SD 3.5 MMDiT and Chroma transformer graphs pass OpenVINO's
``check()`` (``sdkit/families/graphs``: dynamic batch / image size / text tokens, weightless)."""

from __future__ import annotations

import pytest

GRAPHS = ["sd3_medium_transformer", "sd35_large_transformer", "sd35_medium_transformer", "chroma_transformer"]


@pytest.mark.parametrize("name", GRAPHS)
def test_shipped_sd3_chroma_transformer_passes_check(name: str) -> None:
    from sdkit.families import shipped
    from sdkit.selection import get_backend

    report = get_backend("openvino").check(shipped.load_graph(name))
    assert report.ok, report.unsupported
