"""The shared denoising loop: CFG, scheduler stepping, chunked batches, hooks and callback, each
checked against a plain numpy loop written out here (the oracle) on a tiny ONNX "denoiser"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from sdkit.errors import OptionError
from sdkit.model import Model
from sdkit.pipelines import Component, DenoiseLoop, ModelInMemory, Step, StepHook
from sdkit.schedulers import create_scheduler, noise_from_seed

SHAPE = (2, 4, 3, 3)  # two images' latents
SCALE = 3.0


def _denoiser(batch: int | str = "batch", residual: bool = False) -> Model:
    """out_sample = 0.1 * sample + encoder_hidden_states * timestep / 1000 (+ residual)."""
    latent = [batch, 4, 3, 3]
    inputs = [
        helper.make_tensor_value_info("sample", TensorProto.FLOAT, latent),
        helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, latent),
    ]
    nodes = [
        helper.make_node("Div", ["timestep", "thousand"], ["t"]),
        helper.make_node("Mul", ["encoder_hidden_states", "t"], ["cond"]),
        helper.make_node("Mul", ["sample", "tenth"], ["scaled"]),
        helper.make_node("Add", ["scaled", "cond"], ["out_sample" if not residual else "partial"]),
    ]
    if residual:
        inputs.append(helper.make_tensor_value_info("residual", TensorProto.FLOAT, latent))
        nodes.append(helper.make_node("Add", ["partial", "residual"], ["out_sample"]))
    constants = [
        helper.make_tensor("thousand", TensorProto.FLOAT, [], [1000.0]),
        helper.make_tensor("tenth", TensorProto.FLOAT, [], [0.1]),
    ]
    graph = helper.make_graph(
        nodes, "denoiser", inputs, [helper.make_tensor_value_info("out_sample", TensorProto.FLOAT, latent)], constants
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(proto)
    return Model.from_proto(proto)


def _unet(model: Model) -> Component:
    return Component("unet", ModelInMemory(model, "unet"), backend="reference")


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    latents = rng.standard_normal(SHAPE, dtype=np.float32)
    embeddings = rng.standard_normal((2 * SHAPE[0], *SHAPE[1:]), dtype=np.float32)  # [uncond x2, cond x2]
    return latents, embeddings


def _scheduler(name: str = "euler") -> Any:
    scheduler = create_scheduler(name)
    scheduler.set_timesteps(4)
    return scheduler


class Recorder(StepHook):
    """Doubles the model input, adds a residual feed, blends the latents with zeros."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, tuple[int, ...]]] = []

    def model_input(self, step: Step, sample: np.ndarray) -> np.ndarray:
        return sample * np.float32(2.0)

    def extra_feeds(self, step: Step) -> Mapping[str, np.ndarray]:
        self.steps.append((step.index, step.total, step.model_input.shape))
        assert set(step.feeds) == {"sample", "timestep", "encoder_hidden_states"}
        return {"residual": np.full(step.model_input.shape, 0.01 * (step.index + 1), np.float32)}

    def after_step(self, step: Step, latents: np.ndarray) -> np.ndarray:
        return latents * np.float32(0.5)


def _oracle(latents: np.ndarray, embeddings: np.ndarray, scheduler: Any, noise: Any, hooked: bool) -> np.ndarray:
    """The same loop written out with numpy (diffusers' StableDiffusionPipeline, step by step)."""
    for index, t in enumerate(scheduler.timesteps):
        x = scheduler.scale_model_input(latents, t)
        x = np.concatenate([x, x])
        if hooked:
            x = x * np.float32(2.0)
        prediction = (0.1 * x + embeddings * (np.float32(t) / 1000)).astype(np.float32)
        if hooked:
            prediction += np.float32(0.01 * (index + 1))
        uncond, cond = np.split(prediction, 2)
        unguided = {"uncond": uncond} if scheduler.needs_uncond else {}  # CFG++ samplers take it
        latents = scheduler.step(uncond + SCALE * (cond - uncond), t, latents, noise=noise, **unguided)
        if hooked:
            latents = latents * np.float32(0.5)
    return np.asarray(latents)


@pytest.mark.parametrize("sampler", ["euler", "euler_a", "dpm_2_a", "euler_cfg_pp", "dpmpp_2m_cfg_pp"])
def test_the_loop_is_cfg_plus_scheduler_steps(sampler: str) -> None:
    latents, embeddings = _inputs()
    seen: list[tuple[int, int]] = []
    loop = DenoiseLoop(
        denoiser=_unet(_denoiser()),
        scheduler=_scheduler(sampler),
        guidance_scale=SCALE,
        conditioning={"encoder_hidden_states": embeddings},
        noise=noise_from_seed(7),
        callback=lambda i, n, x: seen.append((i, n)),
    )
    got = loop.run(latents)
    want = _oracle(latents, embeddings, _scheduler(sampler), noise_from_seed(7), hooked=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    calls = len(_scheduler(sampler).timesteps)  # model calls: 7 for DPM2 a's 4 steps
    assert seen == [(i, calls) for i in range(calls)]
    if _scheduler(sampler).needs_uncond:  # without the unguided prediction the result differs
        scheduler = _scheduler(sampler)
        for t in scheduler.timesteps:
            x = scheduler.scale_model_input(latents, t)
            prediction = (0.1 * np.concatenate([x, x]) + embeddings * (np.float32(t) / 1000)).astype(np.float32)
            uncond, cond = np.split(prediction, 2)
            latents = scheduler.step(uncond + SCALE * (cond - uncond), t, latents)
        assert np.abs(latents - got).max() > 1e-3


def test_hooks_add_feeds_change_the_input_and_the_latents() -> None:
    latents, embeddings = _inputs()
    hook = Recorder()
    loop = DenoiseLoop(
        denoiser=_unet(_denoiser(residual=True)),
        scheduler=_scheduler(),
        guidance_scale=SCALE,
        conditioning={"encoder_hidden_states": embeddings},
        hooks=(hook,),
    )
    got = loop.run(latents)
    np.testing.assert_allclose(got, _oracle(latents, embeddings, _scheduler(), None, hooked=True), rtol=1e-5, atol=1e-6)
    assert hook.steps == [(i, 4, (4, 4, 3, 3)) for i in range(4)]


def test_a_graph_with_a_fixed_batch_runs_in_chunks() -> None:
    latents, embeddings = _inputs()
    results = []
    for batch in ("batch", 1):
        loop = DenoiseLoop(
            denoiser=_unet(_denoiser(batch=batch)),
            scheduler=_scheduler(),
            guidance_scale=SCALE,
            conditioning={"encoder_hidden_states": embeddings},
        )
        results.append(loop.run(latents))
    np.testing.assert_array_equal(results[0], results[1])


def test_no_guidance_runs_one_batch() -> None:
    latents, embeddings = _inputs()
    cond = embeddings[SHAPE[0] :]
    loop = DenoiseLoop(_unet(_denoiser()), _scheduler(), 1.0, {"encoder_hidden_states": cond})
    scheduler = _scheduler()
    want = latents
    for t in scheduler.timesteps:
        x = scheduler.scale_model_input(want, t)
        want = scheduler.step((0.1 * x + cond * (np.float32(t) / 1000)).astype(np.float32), t, want)
    np.testing.assert_allclose(loop.run(latents), want, rtol=1e-5, atol=1e-6)


def test_stop_after_runs_the_first_steps_only() -> None:
    """The seam a base/refiner split needs: the first k steps, as the full loop ran them."""
    latents, embeddings = _inputs()
    seen: list[tuple[int, int]] = []

    def loop(stop_after: int | None) -> DenoiseLoop:
        return DenoiseLoop(
            _unet(_denoiser()),
            _scheduler(),
            SCALE,
            {"encoder_hidden_states": embeddings},
            callback=lambda i, n, x: seen.append((i, n)),
            stop_after=stop_after,
        )

    partial = loop(2).run(latents)
    assert seen == [(0, 2), (1, 2)]
    scheduler = _scheduler()
    want = latents
    for t in scheduler.timesteps[:2]:
        x = np.concatenate([scheduler.scale_model_input(want, t)] * 2)
        uncond, cond = np.split((0.1 * x + embeddings * (np.float32(t) / 1000)).astype(np.float32), 2)
        want = scheduler.step(uncond + SCALE * (cond - uncond), t, want)
    np.testing.assert_allclose(partial, want, rtol=1e-5, atol=1e-6)


def test_cfg_pp_without_guidance_is_refused() -> None:
    """CFG++ needs the unguided prediction; without guidance there is none (ComfyUI would run the
    unconditional pass anyway at cfg 1): one clear error, not a silent fall back to Euler."""
    latents, embeddings = _inputs()
    loop = DenoiseLoop(_unet(_denoiser()), _scheduler("euler_cfg_pp"), 1.0, {"encoder_hidden_states": embeddings[2:]})
    with pytest.raises(OptionError, match=r"guidance_scale > 1"):
        loop.run(latents)
