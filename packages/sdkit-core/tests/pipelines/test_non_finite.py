"""NaN and infinity (issue 30, item 9): a NaN weight, an infinite one or a scheduler config that
makes NaN used to give a black image and success. Each is now a ``NonFiniteError`` naming where
it first appeared (the component, the step), found by one cheap check per stage and step.

End to end on the committed tiny pipeline with one value of one real weight changed; the step,
sampler and VAE cases on one-node graphs (fast)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sdkit
from sdkit.errors import NonFiniteError
from sdkit.model import Model
from sdkit.pipelines import Component, DenoiseLoop, ModelInMemory
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.stages import vae
from sdkit.schedulers import create_scheduler

BACKEND = "ggml" if importlib.util.find_spec("sdkit_ggml") else "reference"
SHAPE = (1, 4, 3, 3)


def _poisoned(tiny_dir: Path, tmp_path: Path, component: str, op_type: str, value: float) -> Path:
    """A copy of the tiny pipeline whose ``component`` has ``value`` in its first ``op_type``'s
    weight (one element; the rest is the real model)."""
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    path = copy / component / "model.onnx"
    model = onnx.load(path)
    name = next(node.input[1] for node in model.graph.node if node.op_type == op_type)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(tensor).copy()
    array.reshape(-1)[0] = value
    tensor.CopyFrom(numpy_helper.from_array(array, name))
    onnx.save(model, path)
    return copy


def test_a_nan_unet_weight_is_named_at_its_first_step(tiny_dir: Path, tmp_path: Path) -> None:
    folder = _poisoned(tiny_dir, tmp_path, "unet", "Conv", float("nan"))
    message = r"^NaN first appeared in the unet's output at step 1 of 2 .*weights"
    with sdkit.load_pipeline(folder, backend=BACKEND) as pipe, pytest.raises(NonFiniteError, match=message):
        pipe.generate("a horse", steps=2, width=32, height=32, seed=3)


def _graph_model(nodes: list[onnx.NodeProto], inputs: dict[str, list[object]], constants: dict[str, float]) -> Model:
    """One output, shaped like the first input."""
    first = next(iter(inputs.values()))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, first)],
        [helper.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in constants.items()],
    )
    return Model.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def _denoiser(poison_at: float) -> Component:
    """out_sample = 0.1 * sample + 0 / (timestep - poison_at): NaN at that timestep only."""
    nodes = [
        helper.make_node("Mul", ["sample", "tenth"], ["scaled"]),
        helper.make_node("Sub", ["timestep", "at"], ["dt"]),
        helper.make_node("Div", ["zero", "dt"], ["nan_there"]),
        helper.make_node("Add", ["scaled", "nan_there"], ["out_sample"]),
    ]
    model = _graph_model(
        nodes, {"sample": ["n", 4, 3, 3], "timestep": [1]}, {"tenth": 0.1, "at": poison_at, "zero": 0.0}
    )
    return Component("unet", ModelInMemory(model, "unet"), backend="reference")


def _loop(denoiser: Component, scheduler_config: dict[str, object] | None = None) -> DenoiseLoop:
    scheduler = create_scheduler("euler", config=scheduler_config)
    scheduler.set_timesteps(4)
    return DenoiseLoop(denoiser=denoiser, scheduler=scheduler, guidance_scale=1.0, conditioning={})


def test_the_first_step_with_nan_is_named() -> None:
    loop = _loop(_denoiser(-1.0))
    third = float(loop.scheduler.timesteps[2])
    latents = np.ones(SHAPE, np.float32)
    with pytest.raises(
        NonFiniteError, match=r"^NaN first appeared in the unet's output at step 3 of 4 \(36 of 36 values\)"
    ):
        _loop(_denoiser(third)).run(latents)
    assert np.isfinite(loop.run(latents)).all()  # a timestep it never reaches: no NaN


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy says so as the NaN appears
def test_a_scheduler_config_that_makes_nan_is_named_as_the_sampler() -> None:
    loop = _loop(_denoiser(-1.0), {"beta_end": 5.0})  # betas over 1: negative alphas, NaN sigmas
    with pytest.raises(NonFiniteError, match=r"first appeared in the sampler's noise levels .*scheduler_config\.json"):
        loop.run(np.ones(SHAPE, np.float32))


def test_nan_initial_latents_are_named() -> None:
    latents = np.ones(SHAPE, np.float32)
    latents[0, 0, 0, 0] = np.nan
    with pytest.raises(NonFiniteError, match=r"first appeared in the initial latents"):
        _loop(_denoiser(-1.0)).run(latents)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the decoder divides by zero on purpose
def test_an_infinite_vae_decoder_output_is_named() -> None:
    nodes = [helper.make_node("Div", ["latent_sample", "zero"], ["sample"])]  # x / 0: inf and NaN
    decoder = Component(
        "vae_decoder",
        ModelInMemory(_graph_model(nodes, {"latent_sample": ["n", 3, 2, 2]}, {"zero": 0.0})),
        backend="reference",
    )
    latents = np.ones((1, 3, 2, 2), np.float32)
    with pytest.raises(NonFiniteError, match=r"^infinity first appeared in the vae_decoder's output \(12 of 12"):
        vae.decode(decoder, latents, PipelineConfig("tiny"))
