"""Fixtures: real ``sdkit serve`` processes on free loopback ports, serving the repo's tiny SD
pipeline (``fixtures/tiny_pipeline/model``), and a tiny ONNX preview decoder written here."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for ``import serve_helpers`` under importlib mode

from serve_helpers import API_KEY, TINY, ServerProcess, serve_backend, write_preview_decoder


@pytest.fixture(scope="session")
def tiny() -> Path:
    if not (TINY / "model_index.json").is_file():
        pytest.skip(f"the tiny pipeline fixture is missing ({TINY})")
    return TINY


@pytest.fixture(scope="session")
def backend() -> str:
    return serve_backend()


@pytest.fixture(scope="session")
def preview_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_preview_decoder(tmp_path_factory.mktemp("preview") / "tiny_decoder.onnx")


@pytest.fixture(scope="session")
def server(
    tiny: Path, backend: str, preview_decoder: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The main server: queue of 8, API key, preview decoder, a LoRA folder, two model names."""
    work = tmp_path_factory.mktemp("server")
    second = work / "tiny_b"
    second.symlink_to(tiny, target_is_directory=True)
    loras = work / "loras"
    loras.mkdir()
    (loras / "film.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    args = ["--model", str(tiny), "--model", str(second), "--backend", backend, "--queue-size", "8"]
    args += ["--preview-decoder", str(preview_decoder), "--lora-dir", str(loras), "--log-level", "warning"]
    process = ServerProcess(args, work / "server.log", api_key=API_KEY)
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="session")
def small_server(tiny: Path, backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with small limits and no key or preview: for fuzzing and limit checks."""
    work = tmp_path_factory.mktemp("small_server")
    args = ["--model", str(tiny), "--backend", backend, "--queue-size", "2", "--log-level", "warning"]
    args += ["--max-width", "64", "--max-height", "64", "--max-steps", "3", "--max-batch", "2", "--max-body-mb", "1"]
    process = ServerProcess(args, work / "server.log", isolate=False)
    try:
        yield process.wait_ready()
    finally:
        process.stop()
