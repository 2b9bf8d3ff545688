"""One stable-diffusion.cpp context (``stable_diffusion_cpp.StableDiffusion``): the files it loads,
the settings it is created with, and a generation with sdkit's step callback.

sd.cpp takes its model files (checkpoint or transformer, ``--clip_l``/``--clip_g``/``--t5xxl``,
``--vae``, embeddings) when the context is created, so changing one of them (``set_vae``,
``load_embedding``) releases the context and the next generation creates it again. LoRAs are per
generation (tags in the prompt), no reload.

Errors: the binding raises ``ValueError``/``RuntimeError`` and sd.cpp's loader returns no context
for a file it cannot read; each becomes one ``SdkitError`` naming the file or the option.
"""

from __future__ import annotations

import ctypes
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdkit.errors import InputError, ModelFormatError, OptionError, SdkitError
from sdkit.isolation import isolation_wanted
from sdkit.pipelines.stages.phases import report
from sdkit_sdcpp import binding

StepCallback = Callable[[int, int, np.ndarray], None]
PRECISIONS = {None: "default", "fp32": "f32", "fp16": "f16", "bf16": "bf16"}
OPTIONS = ("threads", "precision", "rng", "flash_attention", "lora_apply_mode", "isolate")
RNGS = ("cuda", "cpu", "default")
# "at_runtime": a LoRA is applied in the graph, the weights stay the file's, so a generation after
# ``set_loras([])`` is the base model's, bit for bit. "immediately" merges into the weights (faster)
# and subtracts on removal, which in f16 does not give the base weights back (measured: images
# one level off afterwards); "auto" is sd.cpp's default (immediately unless the file is quantized).
LORA_MODES = ("at_runtime", "immediately", "auto")


@dataclass(frozen=True)
class ModelFiles:
    """What sd.cpp loads: a whole checkpoint (``model``) or a transformer-only file
    (``diffusion_model``) with its component files, a VAE file, textual-inversion embeddings."""

    model: Path | None = None
    diffusion_model: Path | None = None
    clip_l: Path | None = None
    clip_g: Path | None = None
    t5xxl: Path | None = None
    vae: Path | None = None
    embeddings: tuple[Path, ...] = ()
    control_net: Path | None = None
    llm: Path | None = None  # FLUX.2, Qwen-Image, Z-Image: their language-model text encoder
    clip_vision: Path | None = None  # Wan2.1 I2V: the CLIP image encoder
    high_noise_diffusion_model: Path | None = None  # Wan2.2 14B: the high-noise expert
    photo_maker: Path | None = None  # SDXL: PhotoMaker's ID encoder

    def constructor_kwargs(self) -> dict[str, Any]:
        paths = {
            "model_path": self.model,
            "diffusion_model_path": self.diffusion_model,
            "clip_l_path": self.clip_l,
            "clip_g_path": self.clip_g,
            "t5xxl_path": self.t5xxl,
            "vae_path": self.vae,
            "control_net_path": self.control_net,
            "llm_path": self.llm,
            "clip_vision_path": self.clip_vision,
            "high_noise_diffusion_model_path": self.high_noise_diffusion_model,
            "photo_maker_path": self.photo_maker,
        }
        kwargs: dict[str, Any] = {name: str(path) for name, path in paths.items() if path is not None}
        if self.embeddings:
            kwargs["embedding_paths"] = [str(p) for p in self.embeddings]
        return kwargs


@dataclass(frozen=True)
class ContextSettings:
    """How the context is created: threads, weight type, offload, RNG, device environment."""

    threads: int = -1  # sd.cpp's default: half the CPUs
    wtype: str = "default"  # the file's own types
    offload: bool = False  # memory="offload": weights in RAM, moved to the device when needed
    rng: str = "cuda"  # sd.cpp's default (A1111's GPU noise)
    flash_attention: bool = False
    lora_apply_mode: str = "at_runtime"
    environment: dict[str, str] = field(default_factory=dict)  # SD_VK_DEVICE for vulkan:N
    isolate: bool = False  # the model in a child process (sdkit_sdcpp.context.Child): a cancel stops it at once

    @classmethod
    def from_options(cls, options: dict[str, Any], memory: str, environment: dict[str, str]) -> ContextSettings:
        """From ``load_pipeline``'s options; one sd.cpp has no use for is an ``OptionError``."""
        unknown = [name for name in options if name not in OPTIONS]
        if unknown:
            raise OptionError(
                f"stable-diffusion.cpp takes no option {unknown[0]!r} (it takes {', '.join(OPTIONS)}, "
                "memory='keep' or 'offload')"
            )
        precision = options.get("precision")
        if not isinstance(precision, (str, type(None))) or precision not in PRECISIONS:
            raise OptionError(f"precision {precision!r}: stable-diffusion.cpp takes one of fp32, fp16, bf16")
        threads = options.get("threads", -1)
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise OptionError(f"threads must be an integer, not {threads!r}")
        rng = options.get("rng", "cuda")
        if rng not in RNGS:
            raise OptionError(f"rng {rng!r}: stable-diffusion.cpp's generators are {', '.join(RNGS)}")
        lora_mode = options.get("lora_apply_mode", "at_runtime")
        if lora_mode not in LORA_MODES:
            raise OptionError(f"lora_apply_mode {lora_mode!r}: stable-diffusion.cpp's are {', '.join(LORA_MODES)}")
        flash = bool(options.get("flash_attention"))
        isolate = isolation_wanted(options.get("isolate"))
        return cls(threads, PRECISIONS[precision], memory == "offload", rng, flash, lora_mode, environment, isolate)

    def constructor_kwargs(self) -> dict[str, Any]:
        return {
            "n_threads": self.threads,
            "wtype": self.wtype,
            "offload_params_to_cpu": self.offload,
            "rng_type": self.rng,
            "sampler_rng_type": self.rng,
            "flash_attn": self.flash_attention,
            "lora_apply_mode": self.lora_apply_mode,
            "vae_decode_only": False,  # img2img and inpainting need the encoder
            # verbose=False would point the process's stdout and stderr at /dev/null around every
            # call (the step bar with them); sd.cpp's log goes to ``sdcpp_log`` instead.
            "verbose": True,
        }


class InProcess:
    """A lazily created sd.cpp context for ``files`` and ``settings``, in this process."""

    def __init__(self, files: ModelFiles, settings: ContextSettings) -> None:
        self.files = files
        self.settings = settings
        self._model: Any = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model(self) -> Any:
        if self._model is None:
            self._model = self._create()
        return self._model

    def _create(self) -> Any:
        module = binding.import_binding()
        kwargs = {**self.files.constructor_kwargs(), **self.settings.constructor_kwargs()}
        previous = binding.environment(self.settings.environment)
        capture_log()
        silence_progress()
        LOG.clear()
        try:
            model = module.StableDiffusion(**kwargs)
        except (ValueError, RuntimeError, NotImplementedError) as exc:
            raise ModelFormatError(
                f"stable-diffusion.cpp cannot load {describe(self.files)}: {exc}{last_errors()}"
            ) from None
        finally:
            binding.restore(previous)
            capture_log()
        internals = getattr(model, "_model", None)
        if not getattr(internals, "model", None):
            # sd.cpp returned a NULL context: the binding would free it when the object is collected
            # (free_sd_ctx(NULL): a segfault, found by sdkit tune trying a file sd.cpp cannot read)
            if internals is not None:
                internals.model = None
            raise ModelFormatError(f"stable-diffusion.cpp cannot load {describe(self.files)}{last_errors()}")
        return model

    def release(self) -> None:
        if self._model is not None:
            self._model.close()
            self._model = None

    def call(
        self, kwargs: dict[str, Any], progress: Callable[[int, int, float], None], method: str = "generate_image"
    ) -> list[Any]:
        """``generate_image(**kwargs)`` (or ``generate_video``) with sd.cpp's progress calls sent to
        ``progress``."""
        model = self.model()
        previous = binding.environment(self.settings.environment)
        LOG.clear()
        try:
            images: list[Any] = getattr(model, method)(**kwargs, progress_callback=progress)
        except ValueError as exc:
            if "NULL pointer" in str(exc):  # sd.cpp returned no images
                raise SdkitError(f"stable-diffusion.cpp produced no image{last_errors()}") from None
            raise InputError(f"stable-diffusion.cpp refused the request: {exc}") from None
        except RuntimeError as exc:
            raise SdkitError(f"stable-diffusion.cpp failed: {exc}{last_errors()}") from None
        finally:
            binding.restore(previous)
            silence_progress()
        return images


def describe(files: ModelFiles) -> str:
    named = [p.name for p in (files.model, files.diffusion_model) if p is not None]
    return ", ".join(named) or "the model"


class Progress:
    """sd.cpp's progress calls (``step, steps, seconds``), told apart: each phase starts with a
    ``(0, total)`` call. Sampling phases go to sdkit's step callback as ``(step index, total,
    latents)`` (sd.cpp shows no latents: an empty array); with VAE tiling, a later phase of
    another length is the tiled decode, sent as ``"tile"`` phase events (``sdkit.pipelines.stages.
    phases``) like sdkit's own tiled VAE."""

    def __init__(self, callback: StepCallback | None, tiles: bool) -> None:
        self.callback = callback
        self.tiles = tiles
        self.sampling_total: int | None = None
        self.kind = "step"
        self.last = -1
        self.raised: list[BaseException] = []

    def __call__(self, step: int, steps: int, seconds: float) -> None:
        if self.raised:
            return
        try:
            self.route(int(step), int(steps))
        except BaseException as exc:
            self.raised.append(exc)

    def route(self, step: int, steps: int) -> None:
        if step == 0:  # a new phase
            tile = self.tiles and self.sampling_total is not None and steps != self.sampling_total
            self.kind, self.last = ("tile" if tile else "step"), 0
            if not tile and self.sampling_total is None:
                self.sampling_total = steps
            return
        if step == self.last:  # sd.cpp repeats the last tile
            return
        self.last = step
        if self.kind == "tile":
            report("tile", "vae_decoder", index=step, total=steps)
        elif self.callback is not None:
            self.callback(step - 1, steps, np.zeros((0,), np.float32))


LOG: deque[str] = deque(maxlen=200)  # sd.cpp's recent log lines (warnings and errors)
_LOG_LEVELS = {2: "warning", 3: "error"}
_kept: dict[str, Any] = {}  # the C side holds raw pointers to these callbacks


def capture_log() -> None:
    """Route sd.cpp's log (its C callback is process-wide) into ``LOG`` instead of the terminal,
    and keep the binding's Python logger from printing its system info on every generation."""
    module = binding.import_binding()
    logging.getLogger("stable-diffusion-cpp-python").setLevel(logging.CRITICAL)
    if "log" in _kept:
        module.sd_set_log_callback(_kept["log"], ctypes.c_void_p(0))
        return

    @module.sd_log_callback  # type: ignore[untyped-decorator]
    def keep(level: int, text: bytes, data: ctypes.c_void_p) -> None:
        if level in _LOG_LEVELS:
            LOG.append(f"{_LOG_LEVELS[level]}: {text.decode('utf-8', errors='replace').strip()}")

    _kept["log"] = keep
    module.sd_set_log_callback(keep, ctypes.c_void_p(0))


def last_errors() -> str:
    """sd.cpp's last error lines, for an exception's message (empty when it logged none)."""
    errors = [line for line in LOG if line.startswith("error:")][-3:]
    return f" (stable-diffusion.cpp: {'; '.join(errors)})" if errors else ""


def silence_progress() -> None:
    """Give sd.cpp a progress callback that does nothing: without one it draws its own bar on the
    terminal (loading tensors, every step); and the binding's, set for a generation, must not
    outlive the Python function it wraps."""
    module = binding.import_binding()
    if "progress" not in _kept:

        @module.sd_progress_callback  # type: ignore[untyped-decorator]
        def quiet(step: int, steps: int, seconds: float, data: ctypes.c_void_p) -> None:
            return None

        _kept["progress"] = quiet
    module.sd_set_progress_callback(_kept["progress"], ctypes.c_void_p(0))
