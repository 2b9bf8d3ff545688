"""The server's configuration: which models, how they run, request limits, and who may connect."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdkit.errors import InputError, OptionError


@dataclass(frozen=True)
class Limits:
    """Request limits: a request over one is refused with HTTP 400 before anything runs."""

    max_width: int = 2048
    max_height: int = 2048
    max_steps: int = 150
    max_batch: int = 8  # images per request: batch_size * n_iter
    max_body_bytes: int = 64 * 1024 * 1024  # init images arrive as base64 in the JSON body
    max_prompt_chars: int = 20_000  # prompt and negative prompt, each (A1111 prompts: a few hundred)

    def __post_init__(self) -> None:
        for name in ("max_width", "max_height", "max_steps", "max_batch", "max_body_bytes", "max_prompt_chars"):
            if getattr(self, name) < 1:
                raise OptionError(f"{name} must be at least 1, got {getattr(self, name)}")

    def check(self, width: int | None, height: int | None, steps: int, images: int) -> None:
        for value, limit, what in (
            (width, self.max_width, "width"),
            (height, self.max_height, "height"),
            (steps, self.max_steps, "steps"),
            (images, self.max_batch, "batch_size * n_iter"),
        ):
            if value is not None and value > limit:
                flag = "--max-batch" if what.startswith("batch") else f"--max-{what}"
                raise InputError(f"{what} {value} is over this server's limit of {limit} (sdkit serve {flag})")

    def check_prompt(self, *prompts: str) -> None:
        for what, text in zip(("prompt", "negative_prompt"), prompts, strict=False):
            if len(text) > self.max_prompt_chars:
                raise InputError(
                    f"{what} is {len(text)} characters, over this server's limit of {self.max_prompt_chars} "
                    "(sdkit serve --max-prompt-chars)"
                )

    def check_pixels(self, width: int, height: int, what: str) -> None:
        """An uploaded image may be at most four times the largest allowed output, so a tiny
        compressed PNG cannot expand into gigabytes."""
        if width * height > 4 * self.max_width * self.max_height:
            raise InputError(f"{what} is {width}x{height}, over this server's limit on image size")


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server (or each Ray Serve replica) needs to build its engine."""

    models: tuple[Path, ...]
    backend: str | Mapping[str, str] = "auto"
    device: str | Mapping[str, str] | None = None
    memory: str = "keep"
    options: Mapping[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    queue_size: int = 8  # requests waiting behind the running one; one more gets 429
    api_key: str | None = None
    preview_decoder: Path | None = None
    lora_dir: Path | None = None
    ckpt_dir: Path | None = None  # A1111's models/Stable-diffusion: files and pipeline folders, subfolders too
    vae_dir: Path | None = None  # A1111's models/VAE: the files sd_vae names
    host: str = "127.0.0.1"  # the address it listens on: the Host headers a keyless server accepts
    embeddings_dir: Path | None = None
    controlnet_dir: Path | None = None
    face_dir: Path | None = None  # A1111's GFPGAN / CodeFormer files (sdkit_serve.faces)
    face_restoration_model: str | None = None  # A1111's setting; None: CodeFormer if present
    code_former_weight: float = 0.5  # A1111's setting

    def __post_init__(self) -> None:
        if not self.models and self.ckpt_dir is None:
            raise OptionError("give at least one --model, or --ckpt-dir")
        if self.api_key is not None:
            check_api_key(self.api_key)
        names = [model_name(p) for p in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise OptionError(f"two --model folders share the name {duplicates[0]!r}; model names must differ")
        if self.queue_size < 0:
            raise OptionError(f"the queue size must be >= 0, got {self.queue_size}")
        if self.preview_decoder is not None and not Path(self.preview_decoder).is_file():
            raise InputError(f"preview decoder not found: {self.preview_decoder}")
        for folder, what in (
            (self.lora_dir, "LoRA"),
            (self.embeddings_dir, "embeddings"),
            (self.controlnet_dir, "ControlNet"),
            (self.face_dir, "face model (--face-dir)"),
            (self.ckpt_dir, "checkpoint (--ckpt-dir)"),
            (self.vae_dir, "VAE (--vae-dir)"),
        ):
            if folder is not None and not Path(folder).is_dir():
                raise InputError(f"{what} folder not found: {folder}")
        if self.face_restoration_model not in (None, "GFPGAN", "CodeFormer"):
            raise OptionError(
                f"face_restoration_model must be GFPGAN or CodeFormer, got {self.face_restoration_model!r}"
            )
        if not 0.0 <= self.code_former_weight <= 1.0:
            raise OptionError(f"code_former_weight must be in [0, 1], got {self.code_former_weight}")


def check_api_key(key: str) -> None:
    """An API key a client can send: not empty (that would start an open server unnoticed), and
    printable ASCII without spaces (an HTTP header cannot carry anything else reliably)."""
    if not key.strip():
        raise OptionError("the API key is empty: give a real one, or leave --api-key out for a keyless loopback server")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise OptionError(
            "the API key must be printable ASCII without spaces (clients send it in an HTTP header, "
            "which cannot carry other characters reliably)"
        )


def model_name(path: Path) -> str:
    """A model's title in the API (``sd_model_checkpoint``): its folder name (a symlink's own name,
    so links to one folder can be offered under several names)."""
    return Path(path).absolute().name


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; any other name or address may be reachable
    from other machines."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, allow_public: bool) -> None:
    """Refuse to listen beyond this machine without an API key, unless explicitly forced."""
    if is_loopback(host) or api_key or allow_public:
        return
    raise OptionError(
        f"refusing to listen on {host} without --api-key: anyone who can reach it could use this machine; "
        "give --api-key KEY (or --allow-public-without-key to do it anyway)"
    )
