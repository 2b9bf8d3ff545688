"""The denoising loop every pipeline shares: scheduler stepping, classifier-free guidance,
batching, the timestep feed, the per-step callback, and hooks for what a pipeline adds.

Per step, exactly as diffusers' pipelines do::

    x = scheduler.scale_model_input(latents, t)
    x = concat([x, x]) when guided                       # one denoiser batch of 2N: [uncond, cond]
    x = hook.model_input(step, x)                        # inpainting UNets: + mask, masked image
    feeds = {sample: x, timestep: t, **conditioning, **hook.extra_feeds(step)}   # ControlNet residuals
    prediction = denoiser(feeds)                         # in chunks when its graph fixes the batch
    prediction = uncond + scale * (cond - uncond)        # when guided
    latents = scheduler.step(prediction, t, latents, noise)   # + uncond= for CFG++ samplers
    latents = hook.after_step(step, latents)             # masked img2img: blend with the image
    callback(index, total, latents)

Each stage's result is checked for NaN and infinity (``check_finite``: one pass over a
latents-sized array), so a NaN weight or config is an error naming where it first appeared, the
component and the step, rather than a black image.

SD 1.x/2.x use it as it is; SDXL adds its pooled text embeddings and ``time_ids`` to
``conditioning``; inpainting, ControlNet and later pipelines add a ``StepHook``; flow-matching
models (SD3, Flux) bring their own scheduler and input names (``DenoiserInputs``). None copies
the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.errors import ModelFormatError, OptionError
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.execution import check_finite, input_info, run_batched

SAMPLER_HINT = "the sampler's settings or its scheduler_config.json may hold NaN, inf or values that overflow"
ENCODER_HINT = "a text encoder's weights or an embedding may hold NaN or inf"
WEIGHTS_HINT = "its weights, or a LoRA merged into them, may hold NaN or inf"
StepCallback = Callable[[int, int, np.ndarray], None]  # (step index, total steps, latents)
NoiseFn = Callable[[tuple[int, ...]], np.ndarray]
T = TypeVar("T")


@dataclass(frozen=True)
class DenoiserInputs:
    """The denoiser graph's input and output names (diffusers/optimum's UNet export by default)."""

    sample: str = "sample"
    timestep: str = "timestep"
    outputs: tuple[str, ...] = ("out_sample",)
    # Flux and Chroma take the scheduler's timestep / 1000 (sigma), divided in float32 as diffusers.
    timestep_divisor: float = 1.0


@dataclass
class Step:
    """One step, as hooks see it. ``model_input`` is the denoiser's sample after scaling and the
    guidance doubling (batch 2N when guided, else N); ``feeds`` what the denoiser will get."""

    index: int
    total: int
    timestep: Any  # the scheduler's own value, scheduler.timesteps[index]
    latents: np.ndarray
    model_input: np.ndarray
    feeds: dict[str, np.ndarray] = field(default_factory=dict)


class StepHook:
    """What a pipeline adds to the shared loop. Override what you need; each default is a no-op."""

    def model_input(self, step: Step, sample: np.ndarray) -> np.ndarray:
        """The denoiser's sample feed (e.g. an inpainting UNet's latents + mask + masked image)."""
        return sample

    def extra_feeds(self, step: Step) -> Mapping[str, np.ndarray]:
        """More denoiser feeds for this step, batched like the sample (e.g. ControlNet residuals)."""
        return {}

    def after_step(self, step: Step, latents: np.ndarray) -> np.ndarray:
        """The latents after the scheduler's step (e.g. masked img2img blending in the image)."""
        return latents

    def hold(self, run: Callable[[], T]) -> T:
        """Run the whole loop (``run()``); a hook that needs models at every step (ControlNet)
        compiles them here, once for the loop, and releases them after (``memory="offload"``)."""
        return run()


@dataclass
class DenoiseLoop:
    """The loop for one request: ``DenoiseLoop(...).run(latents)`` returns the final latents.

    ``conditioning``: denoiser feeds that stay the same every step, batched like the sample
    (``encoder_hidden_states`` as ``[uncond x N, cond x N]`` when guided). ``noise``: the per-step
    noise draw of ancestral/SDE samplers (``NoiseStream.normal``). ``stop_after``: run only the
    first steps of the schedule (a base/refiner split hands the rest to a second loop, whose
    scheduler starts there as img2img's ``strength`` does).
    """

    denoiser: Component
    scheduler: Any  # sdkit.schedulers.Scheduler, or anything with its four methods
    guidance_scale: float
    conditioning: Mapping[str, np.ndarray]
    noise: NoiseFn | None = None
    hooks: Sequence[StepHook] = ()
    callback: StepCallback | None = None
    inputs: DenoiserInputs = field(default_factory=DenoiserInputs)
    stop_after: int | None = None

    @property
    def guided(self) -> bool:
        return self.guidance_scale > 1.0

    def run(self, latents: np.ndarray) -> np.ndarray:
        if getattr(self.scheduler, "needs_uncond", False) and not self.guided:
            name = getattr(self.scheduler, "name", type(self.scheduler).__name__)
            raise OptionError(
                f"sampler {name!r} (CFG++) renoises with the unguided prediction, which only classifier-free "
                f"guidance computes: use guidance_scale > 1 (this run has {self.guidance_scale:g}; "
                "a guidance-distilled model such as FLUX.1 dev has none)"
            )

        def held(compiled: CompiledModel) -> np.ndarray:
            def loop() -> np.ndarray:
                return self._run(compiled, latents)

            work = loop
            for hook in reversed(self.hooks):  # the first hook holds outermost
                work = _held_by(hook, work)
            return work()

        return self.denoiser.use(held)

    def _run(self, compiled: CompiledModel, latents: np.ndarray) -> np.ndarray:
        scheduler = self.scheduler
        self._check_start(latents)
        timesteps = [float(t) for t in np.asarray(scheduler.timesteps).reshape(-1)][: self.stop_after]
        for index, t in enumerate(timesteps):
            at = f"step {index + 1} of {len(timesteps)}"
            timestep = scheduler.timesteps[index]
            sample = np.asarray(scheduler.scale_model_input(latents, timestep), dtype=np.float32)
            check_finite(sample, f"the sampler's input scaling at {at}", SAMPLER_HINT)
            if self.guided:
                sample = np.concatenate([sample, sample], axis=0)
            step = Step(index, len(timesteps), timestep, latents, sample)
            prediction, uncond = self._predict(compiled, step, t)
            extra = {"uncond": uncond} if uncond is not None and getattr(scheduler, "needs_uncond", False) else {}
            latents = np.asarray(
                scheduler.step(prediction, timestep, latents, noise=self.noise, **extra), dtype=np.float32
            )
            check_finite(latents, f"the sampler's step at {at}", SAMPLER_HINT)
            for hook in self.hooks:
                latents = hook.after_step(step, latents)
                check_finite(latents, f"{type(hook).__name__}'s after_step at {at}")
            if self.callback is not None:
                self.callback(index, len(timesteps), latents)
        return latents

    def _check_start(self, latents: np.ndarray) -> None:
        """What the loop starts from holds no NaN or infinity: the sampler's schedule, the
        initial latents and the conditioning (the text encoders' outputs)."""
        check_finite(np.asarray(self.scheduler.timesteps), "the sampler's timesteps", SAMPLER_HINT)
        sigmas = getattr(self.scheduler, "sigmas", None)
        if sigmas is not None:
            check_finite(np.asarray(sigmas), "the sampler's noise levels (sigmas)", SAMPLER_HINT)
        check_finite(latents, "the initial latents (the noise, or the init image's encoding)")
        for name, value in self.conditioning.items():
            check_finite(value, f"the denoiser's {name!r} feed (the prompts' encoding)", ENCODER_HINT)

    def _predict(self, compiled: CompiledModel, step: Step, t: float) -> tuple[np.ndarray, np.ndarray | None]:
        """The denoiser's guided prediction for one step, and the unguided one when guided (CFG++
        samplers, ``scheduler.needs_uncond``, take it)."""
        at = f"step {step.index + 1} of {step.total}"
        sample = step.model_input
        for hook in self.hooks:
            sample = hook.model_input(step, sample)
        check_finite(sample, f"the {self.denoiser.name}'s sample feed at {at}")
        names = self.inputs
        step.feeds = {names.sample: sample, names.timestep: self.timestep_feed(compiled, t, sample.shape[0])}
        step.feeds.update(self.conditioning)
        for hook in self.hooks:
            extra = hook.extra_feeds(step)
            for name, value in extra.items():
                check_finite(value, f"the {name!r} feed {type(hook).__name__} adds at {at}")
            step.feeds.update(extra)
        batch = sample.shape[0]
        batched = tuple(k for k, v in step.feeds.items() if k == names.sample or _batched(k, v, names, batch))
        prediction = run_batched(compiled, step.feeds, batched, names.outputs, self.denoiser.name).astype(np.float32)
        check_finite(prediction, f"the {self.denoiser.name}'s output at {at}", WEIGHTS_HINT)
        if not self.guided:
            return prediction, None
        guided = self.guide(prediction)
        check_finite(guided, f"classifier-free guidance (scale {self.guidance_scale:g}) at {at}")
        return guided, np.split(prediction, 2, axis=0)[0]

    def guide(self, prediction: np.ndarray) -> np.ndarray:
        """Classifier-free guidance: ``uncond + scale * (cond - uncond)``."""
        uncond, cond = np.split(prediction, 2, axis=0)
        guided: np.ndarray = uncond + self.guidance_scale * (cond - uncond)
        return guided

    def timestep_feed(self, compiled: CompiledModel, t: float, batch: int) -> np.ndarray:
        """The timestep in the dtype and shape the graph wants (``timestep_feed`` below)."""
        return timestep_feed(compiled, t, batch, self.inputs, self.denoiser.name)


def timestep_feed(compiled: CompiledModel, t: float, batch: int, names: DenoiserInputs, component: str) -> np.ndarray:
    """The timestep in the dtype and shape a denoiser (or ControlNet) graph wants: a scalar, one
    value, or one per sample (integer graphs get the rounded value)."""
    info = input_info(compiled, names.timestep)
    if info is None:
        raise ModelFormatError(f"the {component} has no {names.timestep!r} input")
    if names.timestep_divisor != 1.0:  # Flux and Chroma take t / 1000
        t = float(np.float32(t) / np.float32(names.timestep_divisor))
    value = np.round(t) if np.issubdtype(info.dtype, np.integer) else t
    if not info.shape:
        return np.asarray(value, dtype=info.dtype)
    sample = input_info(compiled, names.sample)
    first = info.shape[0]
    if isinstance(first, int) and first > 0:
        length = first
    elif sample is not None and sample.shape and first == sample.shape[0]:
        length = batch
    else:
        length = 1
    return np.full((length,), value, dtype=info.dtype)


def _held_by(hook: StepHook, work: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    return lambda: hook.hold(work)


def _batched(name: str, value: np.ndarray, names: DenoiserInputs, batch: int) -> bool:
    """Whether a feed is split with the sample when the graph fixes a smaller batch: every
    per-sample feed; the timestep only when it has one value per sample."""
    if name == names.timestep:
        return bool(value.ndim) and value.shape[0] == batch > 1
    return bool(value.ndim) and value.shape[0] == batch
