"""Stable Diffusion 1.x/2.x, txt2img and img2img, on any backend.

The loop is diffusers' ``StableDiffusionPipeline`` / ``StableDiffusionImg2ImgPipeline``: CLIP text
embeddings for the prompt and the negative prompt, classifier-free guidance
(``uncond + scale * (cond - uncond)`` when ``guidance_scale > 1``), a scheduler from
``sdkit.schedulers`` stepping the latents, the VAE decoding ``latents / scaling_factor``. Every
model runs through ``sdkit.compile`` on the backend chosen for its component; random numbers come
from ``sdkit.pipelines.rng`` (documented, backend-independent).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines.arguments import as_int, check_request
from sdkit.pipelines.components import Component, input_info, output_named
from sdkit.pipelines.images import GenerationParameters, decoded_to_float, float_to_pil, load_init_image
from sdkit.pipelines.rng import NoiseStream, seed_list

if TYPE_CHECKING:
    from PIL import Image

    from sdkit.pipelines.layout import PipelineLayout
    from sdkit.pipelines.tokenizer import ClipTokenizer

StepCallback = Callable[[int, int, np.ndarray], None]  # (step index, total steps, latents)


def _batch_dim(compiled: CompiledModel, name: str) -> int | None:
    """The fixed batch size of input ``name`` (None when the batch axis is dynamic)."""
    info = input_info(compiled, name)
    if info is None or not info.shape:
        return None
    first = info.shape[0]
    return first if isinstance(first, int) and first > 0 else None


def run_batched(
    compiled: CompiledModel,
    feeds: Mapping[str, np.ndarray],
    batched: tuple[str, ...],
    output: tuple[str, ...],
    component: str,
) -> np.ndarray:
    """Run ``compiled`` once, or in chunks when its graph fixes a smaller batch size."""
    batch = feeds[batched[0]].shape[0]
    chunk = _batch_dim(compiled, batched[0]) or batch
    if batch % chunk:
        raise InputError(f"the {component} model takes batches of {chunk}; {batch} cannot be split into them")
    parts = []
    for start in range(0, batch, chunk):
        part = {k: (v[start : start + chunk] if k in batched else v) for k, v in feeds.items()}
        parts.append(np.asarray(output_named(compiled.run(part), output, component)))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _initial_noise(noise: NoiseStream, shape: tuple[int, ...], latents: np.ndarray | None) -> np.ndarray:
    """The initial-noise draw, or the caller's ``latents`` in its place. The stream advances either
    way, so the per-step noise after it is the same with or without explicit latents."""
    drawn = noise.normal(shape)
    return drawn if latents is None else latents


def run_main_input(
    compiled: CompiledModel, name: str, array: np.ndarray, output: tuple[str, ...], component: str
) -> np.ndarray:
    """Run a one-input model: the input called ``name`` (else the first), in its dtype."""
    info = input_info(compiled, name) or compiled.inputs[0]
    return run_batched(compiled, {info.name: array.astype(info.dtype)}, (info.name,), output, component)


class StableDiffusionPipeline:
    """A loaded SD 1.x/2.x pipeline. Create with ``sdkit.load_pipeline``."""

    def __init__(self, layout: PipelineLayout, components: dict[str, Component], tokenizer: ClipTokenizer) -> None:
        self.layout = layout
        self.components = components
        self.tokenizer = tokenizer

    @property
    def name(self) -> str:
        return self.layout.name

    def backends(self) -> dict[str, str | None]:
        """The backend each component ran on (None until it first ran)."""
        return {name: c.backend_name for name, c in self.components.items()}

    def close(self) -> None:
        for component in self.components.values():
            component.release()

    # -- stages ---------------------------------------------------------------------------

    def encode_prompts(self, prompts: list[str]) -> np.ndarray:
        """Text embeddings ``[len(prompts), 77, hidden]`` from the text encoder."""
        ids = self.tokenizer(prompts)
        hidden = self.components["text_encoder"].use(
            lambda compiled: run_main_input(compiled, "input_ids", ids, ("last_hidden_state",), "text_encoder")
        )
        return np.asarray(hidden, dtype=np.float32)

    def encode_image(self, image: np.ndarray, noise: NoiseStream, count: int) -> np.ndarray:
        """VAE-encoded init image for each of ``count`` images, before ``scaling_factor``."""
        encoder = self.components.get("vae_encoder")
        if encoder is None:
            raise ModelFormatError(f"{self.name}: img2img needs vae_encoder/model.onnx, which this pipeline lacks")
        outputs = ("latent_parameters", "latent_sample")
        out = encoder.use(lambda compiled: run_main_input(compiled, "sample", image, outputs, "vae_encoder"))
        out = np.repeat(np.asarray(out, dtype=np.float32), count, axis=0)
        channels = self.latent_channels
        if out.shape[1] == 2 * channels:  # posterior parameters: sample with our own noise
            mean, logvar = out[:, :channels], np.clip(out[:, channels:], -30.0, 20.0)
            sample: np.ndarray = mean + np.exp(0.5 * logvar) * noise.normal(mean.shape)
            return sample
        if out.shape[1] != channels:
            raise ModelFormatError(
                f"the vae_encoder returns {out.shape[1]} channels; expected {channels} or {2 * channels}"
            )
        return out

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Latents -> ``[N, H, W, 3]`` float32 pixels in [0, 1]."""
        scaled = (latents / self.layout.vae_scaling_factor).astype(np.float32)
        decoded = self.components["vae_decoder"].use(
            lambda compiled: run_main_input(compiled, "latent_sample", scaled, ("sample",), "vae_decoder")
        )
        return decoded_to_float(np.asarray(decoded, dtype=np.float32))

    @property
    def latent_channels(self) -> int:
        config = self.layout.configs.get("unet", {})
        return int(config.get("in_channels", 4))

    def _timestep_feed(self, compiled: CompiledModel, t: float, batch: int) -> np.ndarray:
        info = input_info(compiled, "timestep")
        if info is None:
            raise ModelFormatError(f"{self.name}: the unet has no 'timestep' input")
        value = np.round(t) if np.issubdtype(info.dtype, np.integer) else t
        if not info.shape:
            return np.asarray(value, dtype=info.dtype)
        sample = input_info(compiled, "sample")
        first = info.shape[0]
        if isinstance(first, int) and first > 0:
            length = first
        elif sample is not None and sample.shape and first == sample.shape[0]:
            length = batch
        else:
            length = 1
        return np.full((length,), value, dtype=info.dtype)

    def _denoise(
        self,
        *,
        scheduler: Any,
        latents: np.ndarray,
        embeddings: np.ndarray,
        guidance_scale: float,
        noise: NoiseStream,
        callback: StepCallback | None,
    ) -> np.ndarray:
        return self.components["unet"].use(
            lambda compiled: self._denoise_with(
                compiled, scheduler, latents, embeddings, guidance_scale, noise, callback
            )
        )

    def _denoise_with(
        self,
        compiled: CompiledModel,
        scheduler: Any,
        latents: np.ndarray,
        embeddings: np.ndarray,
        guidance_scale: float,
        noise: NoiseStream,
        callback: StepCallback | None,
    ) -> np.ndarray:
        guided = guidance_scale > 1.0
        timesteps = [float(t) for t in np.asarray(scheduler.timesteps).reshape(-1)]
        for index, t in enumerate(timesteps):
            model_input = np.asarray(scheduler.scale_model_input(latents, scheduler.timesteps[index]), dtype=np.float32)
            if guided:
                model_input = np.concatenate([model_input, model_input], axis=0)
            feeds = {
                "sample": model_input,
                "timestep": self._timestep_feed(compiled, t, model_input.shape[0]),
                "encoder_hidden_states": embeddings,
            }
            batched: tuple[str, ...] = ("sample", "encoder_hidden_states")
            if feeds["timestep"].ndim and feeds["timestep"].shape[0] == model_input.shape[0] > 1:
                batched = (*batched, "timestep")
            prediction = run_batched(compiled, feeds, batched, ("out_sample",), "unet").astype(np.float32)
            if guided:
                uncond, cond = np.split(prediction, 2, axis=0)
                prediction = uncond + guidance_scale * (cond - uncond)
            latents = np.asarray(
                scheduler.step(prediction, scheduler.timesteps[index], latents, noise=noise.normal), dtype=np.float32
            )
            if callback is not None:
                callback(index, len(timesteps), latents)
        return latents

    # -- the public call ------------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str = "",
        seed: int | None = None,
        width: int | None = None,
        height: int | None = None,
        steps: int = 20,
        guidance_scale: float = 7.5,
        sampler: str = "euler_a",
        schedule: str | None = None,
        init_image: Any = None,
        strength: float = 0.8,
        num_images: int = 1,
        callback: StepCallback | None = None,
        latents: np.ndarray | None = None,
        output_type: str = "pil",
    ) -> Any:
        """Generate ``num_images`` images (txt2img, or img2img with ``init_image``).

        ``seed=None`` picks a random seed; image ``i`` uses ``seed + i`` (see ``sdkit.pipelines.rng``).
        ``sampler`` is an sdkit scheduler name or a UI label (``"DPM++ 2M Karras"``); ``schedule``
        (``normal``, ``karras``...) is checked against the one a label implies. ``latents`` replaces
        the initial noise draw (txt2img: the unscaled initial latents; img2img: the noise added to
        the encoded image), float32 ``[num_images, 4, height/8, width/8]``; the seeded stream still
        advances past that draw. ``callback(step, total, latents)`` runs after every step. Returns
        PIL images (``output_type="pil"``), each with the A1111-style ``info["parameters"]`` text,
        or a ``[N, H, W, 3]`` float32 array in [0, 1] (``"np"``).
        """
        from sdkit.schedulers import create_scheduler

        if not isinstance(prompt, str) or not isinstance(negative_prompt or "", str):
            raise InputError("prompt and negative_prompt must be strings")
        if output_type not in ("pil", "np"):
            raise InputError(f"output_type must be 'pil' or 'np', not {output_type!r}")
        request = check_request(
            steps=steps,
            width=width,
            height=height,
            sampler=sampler,
            schedule=schedule,
            guidance_scale=guidance_scale,
            strength=strength,
            num_images=num_images,
            img2img=init_image is not None,
        )
        steps, num_images, guidance_scale, strength = (
            request.steps,
            request.num_images,
            request.guidance_scale,
            request.strength,
        )
        canonical, schedule = request.sampler, request.schedule
        seed = secrets.randbits(32) if seed is None else seed
        seeds = seed_list(seed, num_images)
        image = None
        if init_image is not None:
            if "vae_encoder" not in self.components:
                raise ModelFormatError(f"{self.name}: img2img needs vae_encoder/model.onnx, which this pipeline lacks")
            image, width, height = load_init_image(init_image, width, height)
        width = self._check_size(width, "width")
        height = self._check_size(height, "height")
        scheduler = create_scheduler(canonical, schedule=schedule, config=self.layout.scheduler_config or None)
        # Before any model runs, so a strength that leaves no step fails fast.
        scheduler.set_timesteps(steps, strength=strength if image is not None else 1.0)
        factor = self.layout.vae_scale_factor
        shape = (num_images, self.latent_channels, height // factor, width // factor)
        if latents is not None:
            latents = np.asarray(latents)
            if latents.shape != shape or latents.dtype != np.float32:
                raise InputError(f"latents must be float32 {list(shape)}, got {latents.dtype}{list(latents.shape)}")
        noise = NoiseStream(seeds)

        negative = negative_prompt or ""
        embeddings = self.encode_prompts([negative, prompt]) if guidance_scale > 1.0 else self.encode_prompts([prompt])
        embeddings = np.repeat(embeddings, num_images, axis=0)  # [uncond x N, cond x N]

        if image is None:
            start = _initial_noise(noise, shape, latents)
            current = (start * np.float32(scheduler.init_noise_sigma)).astype(np.float32)
        else:
            encoded = self.encode_image(image, noise, num_images) * np.float32(self.layout.vae_scaling_factor)
            start = _initial_noise(noise, shape, latents)
            first = np.asarray(scheduler.timesteps).reshape(-1)[:1]
            current = np.asarray(scheduler.add_noise(encoded.astype(np.float32), start, first), dtype=np.float32)

        current = self._denoise(
            scheduler=scheduler,
            latents=current,
            embeddings=embeddings,
            guidance_scale=float(guidance_scale),
            noise=noise,
            callback=callback,
        )
        pixels = self.decode(current)
        if output_type == "np":
            return pixels
        images = float_to_pil(pixels)
        for i, pil in enumerate(images):
            params = GenerationParameters(
                prompt,
                negative,
                steps,
                canonical,
                schedule,
                float(guidance_scale),
                seeds[i],
                width,
                height,
                self.name,
                float(strength) if image is not None else None,
            )
            pil.info["parameters"] = params.a1111_text()
            pil.info["sdkit_parameters"] = params
        return images

    def _check_size(self, value: Any, what: str) -> int:
        if value is None:
            return self.layout.default_size
        size = as_int(value, what, 8)
        multiple = max(8, self.layout.vae_scale_factor)
        if size % multiple:
            raise InputError(f"{what} must be a multiple of {multiple}, got {size}")
        return size

    def __call__(self, prompt: str, **kwargs: Any) -> list[Image.Image]:
        result: list[Image.Image] = self.generate(prompt, **kwargs)
        return result
