"""The pipeline's stable-diffusion.cpp context (``Context``): in this process, or in a child
process (``Child``).

stable-diffusion.cpp in a child process (``isolate=True``; on in ``sdkit serve``): the only way
to stop it inside an image, and a native abort that ends the child, not this process.

sd.cpp 0.4.7 cannot be stopped mid-image in process: its progress callback returns nothing, it
exposes no abort flag, and its ggml compute runs without an abort callback we can reach. So with
``isolate=True`` the model lives in a child (a fresh interpreter, ``spawn``) that loads it once and
generates on request, sending sd.cpp's progress calls back as they happen. When the step callback
raises (a cancel: ``/interrupt``, a client gone, the caller's own exception), this process kills
the child at once and raises that exception; the next generation starts a new child, which loads
the model again (the price of a cancel: one model load). A child that dies (a ggml abort, a
segfault, the OOM killer) is a ``BackendCrashedError`` naming the signal; the next generation
starts a new one too. What goes down the pipe is sdkit's own data (file paths, settings, the
generation's arguments, PIL images), never a user's file.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from sdkit.errors import BackendCrashedError, InputError, ModelFormatError, OptionError, SdkitError
from sdkit_sdcpp.engine import ContextSettings, InProcess, ModelFiles, Progress, StepCallback, describe

ERRORS: dict[str, type[SdkitError]] = {
    cls.__name__: cls for cls in (SdkitError, InputError, ModelFormatError, OptionError)
}
POLL_S = 0.05  # how often a wait looks at whether the child is still alive


def _child(conn: Connection, files: ModelFiles, settings: ContextSettings) -> None:
    """The child: load the model, then answer ``("generate", kwargs)`` until told to close."""
    context = InProcess(files, settings)
    try:
        context.model()
        conn.send(("ready",))
        while True:
            message = conn.recv()
            if message[0] != "generate":
                return
            method = message[2] if len(message) > 2 else "generate_image"

            def progress(step: int, steps: int, seconds: float) -> None:
                conn.send(("progress", int(step), int(steps)))

            try:
                images = context.call(message[1], progress, method)
            except SdkitError as exc:
                conn.send(("error", type(exc).__name__, str(exc)))
                continue
            # pixels only: the binding's ``info`` holds ctypes objects, which do not pickle
            conn.send(("images", [(image.mode, image.size, image.tobytes()) for image in images]))
    except SdkitError as exc:
        conn.send(("error", type(exc).__name__, str(exc)))
    except (EOFError, KeyboardInterrupt):  # the parent went away
        return
    finally:
        context.release()


def _raise(name: str, message: str) -> None:
    raise ERRORS.get(name, SdkitError)(message)


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Child:
    """The parent's handle on one child: started loaded, generating, killed on a cancel."""

    def __init__(self, files: ModelFiles, settings: ContextSettings, describe: str) -> None:
        self.describe = describe
        spawn = multiprocessing.get_context("spawn")
        self.conn, theirs = spawn.Pipe()
        self.process = spawn.Process(target=_child, args=(theirs, files, settings), daemon=True)
        self.process.start()
        theirs.close()
        answer = self._receive("loading")
        if answer[0] == "error":
            self.stop()
            _raise(answer[1], answer[2])

    def _receive(self, what: str) -> Any:
        while not self.conn.poll(POLL_S):
            if not self.process.is_alive():
                self.process.join()
                raise BackendCrashedError(
                    "sdcpp", f"{what} {self.describe}", _signal_name(self.process.exitcode),
                    "stable-diffusion.cpp's child process died; the next generation starts a new one",
                )  # fmt: skip
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join()
            raise BackendCrashedError("sdcpp", f"{what} {self.describe}", _signal_name(self.process.exitcode)) from None

    def generate(self, kwargs: dict[str, Any], progress: Progress, method: str = "generate_image") -> list[Any]:
        """Images (or a video's frames) for ``kwargs``; the moment ``progress`` holds an exception (the step callback
        raised), the child is killed and that exception raised."""
        self.conn.send(("generate", kwargs, method))
        while True:
            message = self._receive("a generation of")
            if message[0] == "progress":
                progress(message[1], message[2], 0.0)
                if progress.raised:
                    self.stop(kill=True)
                    raise progress.raised[0]
            elif message[0] == "images":
                from PIL import Image

                return [Image.frombytes(mode, size, data) for mode, size, data in message[1]]
            else:
                _raise(message[1], message[2])

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, kill: bool = False) -> None:
        if self.process.is_alive() and not kill:
            with contextlib.suppress(OSError):
                self.conn.send(("close",))
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class Context:
    """The pipeline's sd.cpp context: in this process, or with ``settings.isolate`` in a child
    process (``Child``) that a cancel kills. Created lazily, again after a change of
    files (``with_files``), a cancel or a crash."""

    def __init__(self, files: ModelFiles, settings: ContextSettings) -> None:
        self.files = files
        self.settings = settings
        self._local: InProcess | None = None
        self._child: Child | None = None

    @property
    def loaded(self) -> bool:
        if self.settings.isolate:
            return self._child is not None and self._child.alive
        return self._local is not None and self._local.loaded

    def with_files(self, **changes: Any) -> None:
        """Other model files (``vae=``, ``embeddings=``): the context is released, and created
        again by the next generation."""
        self.release()
        self.files = replace(self.files, **changes)

    def model(self) -> None:
        """Load the model now (in the child with ``isolate``)."""
        if self.settings.isolate:
            self._started()
        else:
            self._in_process().model()

    def _in_process(self) -> InProcess:
        if self._local is None:
            self._local = InProcess(self.files, self.settings)
        return self._local

    def _started(self) -> Any:
        if self._child is None or not self._child.alive:
            self._child = None
            self._child = Child(self.files, self.settings, describe(self.files))
        return self._child

    def describe(self) -> str:
        return describe(self.files)

    def release(self) -> None:
        if self._local is not None:
            self._local.release()
            self._local = None
        if self._child is not None:
            self._child.stop()
            self._child = None

    def generate(
        self, kwargs: dict[str, Any], callback: StepCallback | None, method: str = "generate_image"
    ) -> list[Any]:
        """``generate_image(**kwargs)`` (``method="generate_video"``: a video's frames), with sd.cpp's
        progress sent on (``Progress``). In this process, an exception the step callback raises
        cannot stop sd.cpp's C loop (0.4.7 has no abort): it is raised when the image is done. With
        ``isolate``, the child is killed at once and the exception raised (the next generation loads
        the model in a new child)."""
        progress = Progress(callback, tiles=bool(kwargs.get("vae_tiling")))
        if self.settings.isolate:
            child = self._started()
            try:
                return list(child.generate(kwargs, progress, method))
            except BaseException:
                if not child.alive:
                    self._child = None
                raise
        images = self._in_process().call(kwargs, progress, method)
        if progress.raised:
            raise progress.raised[0]
        return images
