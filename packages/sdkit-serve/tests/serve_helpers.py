"""Helpers for the sdkit-serve tests: ``sdkit serve`` in a child process on a free loopback port,
and a tiny ONNX preview decoder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "fixtures" / "tiny_pipeline" / "model"
API_KEY = "test-key-0123456789"


def serve_backend() -> str:
    """The fastest backend here that runs the tiny pipeline; every comparison in these tests is
    between two runs on the same backend."""
    import sdkit

    available = {b.name for b in sdkit.backends() if b.available}
    return next(b for b in ("openvino", "ggml", "reference") if b in available)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """``sdkit serve`` in a child process (so its memory is its own to measure)."""

    def __init__(
        self, args: list[str], log: Path, api_key: str | None = None, isolate: bool = True, launcher: Path | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.log = log
        # launcher: a script that runs the sdkit CLI after registering test plugins
        start = [sys.executable, str(launcher)] if launcher else [sys.executable, "-m", "sdkit.cli.main"]
        command = [*start, "serve", "--port", str(self.port), *args]
        if api_key:
            command += ["--api-key", api_key]
        # isolation (the server's default) costs a child process per compile and first run:
        # the main server keeps it, the small ones turn it off to save CI time
        env = {**os.environ, "SDKIT_API_KEY": "", "SDKIT_ISOLATE": "" if isolate else "0"}
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"sdkit serve exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/sdapi/v1/options", headers=self.headers, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"sdkit serve did not answer in {timeout} s:\n{self.log.read_text()}")

    def client(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


def write_preview_decoder(path: Path, seed: int = 0) -> Path:
    """A TAESD-shaped stand-in: latents [1, 4, h, w] -> 1x1 conv -> sigmoid -> 2x nearest
    upsample -> pixels [1, 3, 2h, 2w] in [0, 1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((3, 4, 1, 1)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["latent", "w", "b"], ["mixed"]),
        helper.make_node("Sigmoid", ["mixed"], ["squashed"]),
        helper.make_node("Resize", ["squashed", "", "scales"], ["image"], mode="nearest"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_preview_decoder",
        [helper.make_tensor_value_info("latent", TensorProto.FLOAT, [1, 4, "h", "w"])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [weight, bias, scales],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
