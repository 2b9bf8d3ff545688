"""Samplers written the way k-diffusion writes them, driven one model call at a time.

k-diffusion's samplers (and ComfyUI's, which extend them) are loops over a sigma list that call the
denoiser wherever they need it: twice per step for DPM2, three times for Heun++, once for LMS.
sdkit's pipelines instead call ``scheduler.step`` once per model evaluation (diffusers' contract).
This module joins the two: an algorithm is a Python generator over the step sigmas that *yields*
``(x, sigma)`` where it wants the model evaluated and receives an :class:`Evaluated` (the sample the
model saw, as the caller passed it, and the x0 estimates), so each algorithm reads like its
reference and is written once for every model type:

- :class:`KDiscreteSampler`: epsilon / v-prediction models on k-diffusion sigmas (the schedules of
  :class:`~sdkit.schedulers.k_samplers.SigmaScheduler`), ``scale_model_input`` divides by
  ``sqrt(sigma^2 + 1)``, the model's timestep is the (fractional) training timestep of each sigma;
- :class:`KFlowSampler`: flow-matching models (SD3, Flux, Chroma) on the schedules of
  :class:`~sdkit.schedulers.flow_match.FlowMatchEuler`, ``denoised = x - sigma * v`` as ComfyUI's
  ``CONST`` model sampling computes it, timestep ``sigma * 1000``.

The sigma of every model call is known before sampling starts (no algorithm here chooses a sigma
from the sample), so ``set_timesteps`` runs the algorithm once on a dummy sample to list the calls:
``timesteps`` then holds one entry per model evaluation, as diffusers' KDPM2 does. img2img, the
hires fix and a refiner start the algorithm at a later *step*, on the tail of the sigma list (as
A1111 and ComfyUI pass the truncated list to k-diffusion), so multistep samplers start their history
afresh there.

CFG++ samplers also need the unguided prediction: ``step(..., uncond=...)`` (the denoise loop passes
it to schedulers whose ``needs_uncond`` is set, and refuses them without guidance). A direct caller
that passes none gets the guided prediction in its place (the sampler then equals Euler / DPM++ 2M).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.schedulers import noise_schedule
from sdkit.schedulers.base import NoiseFn, Scheduler, f32
from sdkit.schedulers.flow_match import FlowMatchEuler
from sdkit.schedulers.k_samplers import SigmaScheduler

F32 = NDArray[np.float32]


@dataclass(frozen=True)
class Evaluated:
    """What an algorithm gets back for a model call: the sample the model saw (the caller's, which
    a pipeline hook may have changed), its x0 estimate (after guidance) and the unguided one."""

    x: F32
    denoised: F32
    uncond: F32


# An algorithm yields (sample to evaluate, its sigma, the index of the step it belongs to) and
# returns the final sample.
Steps = Generator[tuple[F32, np.float32, int], Evaluated, F32]


@dataclass
class Run:
    """One sampling run: the step sigmas (float32, ending in 0), the start sample, the noise and
    the sampler's options; ``flow`` says the sigmas are a flow model's (ComfyUI's ``CONST``);
    ``snr_first_sigma`` is the sigma ComfyUI's ``offset_first_sigma_for_snr`` puts in place of a
    first sigma >= 1 for the samplers that work in half-log-SNR (a flow model's
    ``percent_to_sigma(1e-4)``; None for sigma models, which it leaves alone)."""

    sigmas: F32
    x: F32
    draw: Callable[[tuple[int, ...]], F32]
    options: Mapping[str, float]
    flow: bool = False
    snr_first_sigma: np.float32 | None = None

    def noise(self) -> F32:
        """A standard-normal draw shaped like the sample (k-diffusion's ``noise_sampler(...)``)."""
        return self.draw(self.x.shape)


Algorithm = Callable[[Run], Steps]


class KSampler(Scheduler):
    """Shared by the generator-driven samplers; subclasses set ``algorithm`` (see the module
    docstring) and mix in one of the two model types below."""

    algorithm: ClassVar[Algorithm]
    _flow: ClassVar[bool] = False  # the model type's: flow sigmas (ComfyUI's CONST)
    _noise: NoiseFn | None = None  # the noise callable of the step in progress
    # The reference function it is checked against (k-diffusion's, else ComfyUI's).
    reference: ClassVar[str] = ""

    # -- what the model type provides -------------------------------------------------------

    def _step_schedule(self, steps: int) -> tuple[F32, NDArray[np.float64]]:
        """(step sigmas ending in 0, float32; the model timestep of each but the last)."""
        raise NotImplementedError

    def _first_step(self, steps: int, strength: float) -> int:
        """The step img2img starts at for ``strength`` (the pipelines' rule for this model type)."""
        raise NotImplementedError

    def _call_timesteps(self, call_sigmas: F32, step_sigmas: F32, step_t: NDArray[np.float64]) -> NDArray[Any]:
        raise NotImplementedError

    def _x0(self, model_output: F32, sample: F32, sigma: np.float32) -> F32:
        raise NotImplementedError

    def _snr_first_sigma(self) -> np.float32 | None:
        """``Run.snr_first_sigma`` (sigma models: None)."""
        return None

    # -- planning -----------------------------------------------------------------------------

    def _build(self, steps: int, strength: float) -> None:
        self._all_sigmas, self._all_t = self._step_schedule(steps)
        self._plan(self._first_step(steps, strength))

    def _begin_for_strength(self, steps: int, strength: float) -> int:
        return 0  # _build already started the plan at img2img's first step

    def _plan(self, first: int) -> None:
        """List the model calls of a run over the step sigmas from step ``first`` on."""
        sigmas, step_t = self._all_sigmas[first:], self._all_t[first:]
        calls: list[np.float32] = []
        starts: list[int] = []  # the call each step starts with
        steps = type(self).algorithm(
            Run(sigmas, np.zeros(1, np.float32), _zeros, self.options, self._flow, self._snr_first_sigma())
        )
        try:
            _, sigma, step = next(steps)
            while True:
                if step == len(starts):
                    starts.append(len(calls))
                calls.append(sigma)
                _, sigma, step = steps.send(Evaluated(*(np.zeros(1, np.float32),) * 3))
        except StopIteration:
            pass
        self._first = first
        self._step_starts = starts
        call_sigmas = np.array(calls, dtype=np.float32)
        self._timesteps = self._call_timesteps(call_sigmas, sigmas, step_t)
        self._sigmas = np.concatenate([call_sigmas, np.zeros(1, np.float32)])
        self._run_sigmas = sigmas
        self._steps: Steps | None = None

    def set_begin_index(self, index: int) -> None:
        """Start at schedule step ``index // order`` (diffusers' ``t_start * order``, what img2img-like
        callers pass: the hires fix, a refiner), or at the step whose first model call is ``index``:
        the run then starts there, on the tail of the schedule's sigmas (as A1111 and ComfyUI hand
        k-diffusion the tail), and ``timesteps`` lists the calls from there."""
        if self.num_inference_steps is None:
            raise InputError("call set_timesteps() before set_begin_index()")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise InputError(f"begin index must be an integer, got {index!r}")
        steps = len(self._all_sigmas) - 1 - self._first
        if index >= 0 and index % self.order == 0 and index // self.order < steps:
            step = int(index) // self.order
        elif index in self._step_starts:
            step = self._step_starts.index(index)
        else:
            raise InputError(
                f"begin index {index} is neither step * {self.order} (of {steps} steps) nor the first model "
                f"call of a step of {self.name!r} (those are {self._step_starts})"
            )
        self._plan(self._first + step)
        self._index = self._begin = 0

    # -- stepping -----------------------------------------------------------------------------

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        sigma = self._sigmas[self._index]
        sample = sample.copy()  # the algorithm may keep it for a later stage; the caller may reuse its array
        self._noise = noise
        if self._steps is None:
            draw = lambda shape: self._draw(self._noise, shape)  # noqa: E731
            self._steps = type(self).algorithm(
                Run(self._run_sigmas, sample, draw, self.options, self._flow, self._snr_first_sigma())
            )
            next(self._steps)  # runs to the first model call, on this sample
        denoised = self._x0(model_output, sample, sigma)
        uncond = denoised if self._uncond is None else self._x0(self._uncond, sample, sigma)
        try:
            x_next, _, _ = self._steps.send(Evaluated(sample, denoised, uncond))
        except StopIteration as done:
            self._steps = None
            return f32(done.value)
        return f32(x_next)


def _zeros(shape: tuple[int, ...]) -> F32:
    return np.zeros(shape, np.float32)


class KDiscreteSampler(KSampler, SigmaScheduler):
    """A k-diffusion sampler on an epsilon / v-prediction model's sigmas."""

    diffusers_defaults: ClassVar[dict[str, Any]] = {
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "linear",
        "timestep_spacing": "linspace",
        "steps_offset": 0,
    }

    def _step_schedule(self, steps: int) -> tuple[F32, NDArray[np.float64]]:
        timesteps, sigmas = self._sigma_schedule(steps)
        return np.concatenate([sigmas, [0.0]]).astype(np.float32), timesteps

    def _first_step(self, steps: int, strength: float) -> int:
        return max(steps - min(int(steps * strength), steps), 0)

    def _call_timesteps(self, call_sigmas: F32, step_sigmas: F32, step_t: NDArray[np.float64]) -> NDArray[Any]:
        """The schedule's timestep at a step sigma, else (a midpoint) the fractional training
        timestep of the sigma, as k-diffusion's ``sigma_to_t`` (A1111, ComfyUI, diffusers' KDPM2)."""
        log_train = np.log(noise_schedule.training_sigmas(self.alphas_cumprod))
        out = []
        for sigma in call_sigmas:
            hits = np.nonzero(step_sigmas[:-1] == sigma)[0]
            if hits.size:
                out.append(step_t[hits[0]])
            else:
                out.append(noise_schedule.sigma_to_t(np.array([sigma], np.float64), log_train)[0])
        return np.array(out, dtype=np.float64)

    def _x0(self, model_output: F32, sample: F32, sigma: np.float32) -> F32:
        return self._denoised(model_output, sample, sigma)


class KFlowSampler(KSampler, FlowMatchEuler):
    """A k-diffusion / ComfyUI sampler on a flow-matching model's sigmas (ComfyUI's ``CONST``)."""

    _flow = True

    def _step_schedule(self, steps: int) -> tuple[F32, NDArray[np.float64]]:
        FlowMatchEuler._build(self, steps, 1.0)
        sigmas = self._sigmas.copy()
        return sigmas, (sigmas[:-1] * np.float32(self.config.num_train_timesteps)).astype(np.float64)

    def _first_step(self, steps: int, strength: float) -> int:
        return FlowMatchEuler._begin_for_strength(self, steps, strength)

    def _call_timesteps(self, call_sigmas: F32, step_sigmas: F32, step_t: NDArray[np.float64]) -> NDArray[Any]:
        return f32(call_sigmas * np.float32(self.config.num_train_timesteps))

    def _x0(self, model_output: F32, sample: F32, sigma: np.float32) -> F32:
        return f32(sample - model_output * sigma)

    def _snr_first_sigma(self) -> np.float32 | None:
        """ComfyUI's ``percent_to_sigma(1e-4)`` of the model: the shift of t = 1 - 1e-4 in float64
        (ModelSamplingDiscreteFlow's ``time_snr_shift(shift, t)``, ModelSamplingFlux's
        ``flux_time_shift(mu, 1, t)``: the schedule's own shift, ``FlowShift.apply``), rounded to
        float32 as ComfyUI's assignment into its float32 sigmas rounds it. No terminal stretch
        (``shift_terminal``): ComfyUI's model sampling has none."""
        return cast(np.float32, np.float32(self.flow.apply(np.array([1.0 - 1e-4]), self._mu)[0]))
