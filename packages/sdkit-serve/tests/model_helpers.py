"""Helpers for the model-management tests: the tiny model families registered in this process
(as sdkit-core's tests register them), ``sdkit serve``'s app in this process on a real loopback
port (so a client library talks HTTP to it), and model folders laid out as A1111's."""

from __future__ import annotations

import json
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import REPO, free_port
from tiny_families import tiny_family_plugins

TINY_FAMILIES = REPO / "fixtures" / "families" / "tiny"


@contextmanager
def tiny_families() -> Iterator[None]:
    """sdkit-core's tiny families (``packages/sdkit-core/tests/conftest.py``), registered as a
    plugin for the duration, as that conftest's ``tiny_families`` fixture does."""
    if not (TINY_FAMILIES / "sd1").is_dir():
        pytest.skip(f"the tiny family fixtures are missing ({TINY_FAMILIES})")
    from sdkit.plugins import manager

    saved = manager._plugins
    manager._plugins = tiny_family_plugins()
    try:
        yield
    finally:
        manager._plugins = saved


class InProcessServer:
    """``create_app(Engine(config))`` under uvicorn on a thread, on a free loopback port."""

    def __init__(self, config: Any) -> None:
        import uvicorn

        from sdkit_serve.app import create_app
        from sdkit_serve.engine import Engine

        self.engine = Engine(config).start()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        server_config = uvicorn.Config(create_app(self.engine), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(server_config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("the in-process server did not start")
            time.sleep(0.05)

    def client(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.close()


def write_variant(source: Path, target: Path, tensor_suffix: str = "out.2.weight") -> Path:
    """A copy of a safetensors checkpoint with one tensor's signs flipped (the UNet's last conv by
    default): a second model of the same family, with other weights."""
    raw = bytearray(source.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    name = next(k for k in header if k.endswith(tensor_suffix) and k.startswith("model.diffusion_model"))
    entry = header[name]
    start, end = (8 + length + offset for offset in entry["data_offsets"])
    itemsize = {"F16": 2, "BF16": 2, "F32": 4}[entry["dtype"]]
    for position in range(start + itemsize - 1, end, itemsize):  # the sign bit is in the last byte
        raw[position] ^= 0x80
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(bytes(raw))
    return target


def copy_into(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    return target
