"""ControlNet: models loaded beside a pipeline, and the hook that feeds their residuals to the UNet.

A ControlNet is a folder with ``model.onnx`` (``sample``, ``timestep``, ``encoder_hidden_states``,
``controlnet_cond`` [B, 3, H, W] in [0, 1], SDXL also ``text_embeds``, ``time_ids`` ->
``down_block_res_sample_0..N-1``, ``mid_block_res_sample``, at conditioning scale 1) and
diffusers' ``config.json`` (which model family it is for, and the residual shapes). Each is a
pipeline component (``controlnet:<name>``) compiled like the others, on its own backend and
device. The UNet that takes the residuals is the folder's ``unet_controlnet/model.onnx``: the
UNet's graph with ``down_block_additional_residual_0..N-1`` and ``mid_block_additional_residual``
inputs (added to its skip connections, as diffusers' ``down_block_additional_residuals``).

Per step ``i`` of ``n``, as diffusers' ControlNet pipelines (``fixtures/tiny_xl/README.md`` 3.4):
each unit acts when ``not (i / n < start or (i + 1) / n > end)``; it runs on the UNet's own
inputs (the guidance-doubled, scaled 4-channel latents, the timestep, the prompt embeddings and
SDXL's added conditioning) and its control image, doubled for guidance; its residuals are
multiplied by its scale (float32) and summed over the units in order. A unit that does not act
at a step is not run (diffusers runs it and multiplies by 0: the same residuals); at a step where
no unit acts the UNet gets zeros.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from sdkit.backend import CompiledModel
from sdkit.errors import InputError, ModelFormatError
from sdkit.files import read_json_object
from sdkit.model import refuse_unsafe_or_missing
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.denoise import DenoiserInputs, Step, StepHook, timestep_feed
from sdkit.pipelines.stages.execution import fixed_batch
from sdkit.pipelines.stages.sources import OnnxFileSource

if TYPE_CHECKING:
    from PIL import Image

    from sdkit.pipelines.control_units import ControlUnit

T = TypeVar("T")
COMPONENT_PREFIX = "controlnet:"
COND_INPUT = "controlnet_cond"
NAMES = DenoiserInputs()


@dataclass
class ControlNet:
    """A loaded ControlNet: its name (what a unit's ``model`` says), component and config."""

    name: str
    component: Component
    config: Mapping[str, Any]

    @property
    def conditioning_factor(self) -> int:
        """Control-image pixels per latent cell: its conditioning embedding halves the size at
        each block after the first (8 for real SD ControlNets)."""
        return int(2 ** (len(self.config["conditioning_embedding_out_channels"]) - 1))

    def residual_shapes(self, batch: int, height: int, width: int) -> list[tuple[int, ...]]:
        """The residuals' shapes for ``[batch, *, height, width]`` latents: conv_in, each layer of
        each down block, each downsampler (stride 2, rounding up), then the mid block."""
        channels = [int(c) for c in self.config["block_out_channels"]]
        layers = self.config.get("layers_per_block", 2)
        per_block = [int(n) for n in layers] if isinstance(layers, list) else [int(layers)] * len(channels)
        shapes = [(batch, channels[0], height, width)]
        for index, (width_c, count) in enumerate(zip(channels, per_block, strict=True)):
            shapes += [(batch, width_c, height, width)] * count
            if index < len(channels) - 1:
                height, width = (height + 1) // 2, (width + 1) // 2
                shapes.append((batch, width_c, height, width))
        return [*shapes, (batch, channels[-1], height, width)]


def read_controlnet(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """``model.onnx`` and the config of a ControlNet folder (or of the folder of a ``model.onnx``)."""
    location = Path(path).expanduser()
    refuse_unsafe_or_missing(location, "ControlNet")
    folder = location if location.is_dir() else location.parent
    model = location if location.is_file() else location / "model.onnx"
    if not model.is_file():
        raise ModelFormatError(f"ControlNet {location}: no model.onnx inside")
    if not (folder / "config.json").is_file():
        raise ModelFormatError(
            f"ControlNet {location}: no config.json beside model.onnx (diffusers writes one; it says "
            "which model family the ControlNet is for and the shapes of its residuals)"
        )
    config = read_json_object(folder / "config.json", "ControlNet config")
    if not isinstance(config.get("conditioning_embedding_out_channels"), list) or not isinstance(
        config.get("block_out_channels"), list
    ):
        raise ModelFormatError(f"ControlNet {location}: config.json is not a ControlNet's (ControlNetModel)")
    return model, config


def named_paths(controlnets: Any) -> dict[str, str | os.PathLike[str]]:
    """``{name: path}`` from one path, a list of paths (named by their folder) or a mapping."""
    if isinstance(controlnets, Mapping):
        items = [(str(k), v) for k, v in controlnets.items()]
    elif isinstance(controlnets, (str, os.PathLike)):
        items = [(_folder_name(controlnets), controlnets)]
    elif isinstance(controlnets, (list, tuple)):
        items = [(_folder_name(p), p) for p in controlnets]
    else:
        raise InputError(
            f"controlnets must be a path, a list of paths or {{name: path}}, not {type(controlnets).__name__}"
        )
    named: dict[str, str | os.PathLike[str]] = {}
    for name, path in items:
        if not isinstance(path, (str, os.PathLike)) or not name:
            raise InputError(f"ControlNet {name!r}: a path is needed, got {path!r}")
        if name in named:
            raise InputError(f"two ControlNets are named {name!r}; name them with a mapping {{name: path}}")
        named[name] = path
    return named


def _folder_name(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"a ControlNet is given by its folder's path, not {type(path).__name__}")
    location = Path(path)
    return location.parent.name if location.suffix == ".onnx" else location.name


def load_controlnet(
    name: str, path: str | os.PathLike[str], component: Callable[[str, OnnxFileSource], Component]
) -> ControlNet:
    model, config = read_controlnet(path)
    return ControlNet(name, component(COMPONENT_PREFIX + name, OnnxFileSource(model)), config)


# -- per request ---------------------------------------------------------------------------------


@dataclass
class ActiveControl:
    """One unit of a request bound to its ControlNet: the control image ``[N, 3, H, W]`` in [0, 1]
    at the generation size, its scale and its start/end fractions."""

    net: ControlNet
    image: np.ndarray
    scale: float
    start: float
    end: float

    def scale_at(self, index: int, total: int) -> float:
        """diffusers' ``controlnet_conditioning_scale * controlnet_keep[i]``."""
        keep = 1.0 - float(index / total < self.start or (index + 1) / total > self.end)
        return self.scale * keep


def control_image(
    unit: ControlUnit, count: int, width: int, height: int, region: tuple[int, int, int, int] | None
) -> np.ndarray:
    """A unit's hint as the ControlNet's ``[count, 3, height, width]`` float32 input in [0, 1]:
    cropped like the init image with "only masked", resized (Lanczos) to the generation size as
    diffusers' control image processor does."""
    from PIL import Image

    image: Image.Image = Image.fromarray(unit.hint)
    if region is not None:
        image = image.crop(region)
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    array = np.asarray(image, dtype=np.float32) / 255.0
    return np.repeat(array.transpose(2, 0, 1)[None], count, axis=0).astype(np.float32)


@dataclass
class ControlNetHook(StepHook):
    """Feeds the summed, scaled residuals of ``controls`` to the UNet at every step."""

    controls: Sequence[ActiveControl]
    _compiled: dict[str, CompiledModel] = field(default_factory=dict, init=False, repr=False)
    _checked: set[str] = field(default_factory=set, init=False, repr=False)

    def hold(self, run: Callable[[], T]) -> T:
        """Compile each ControlNet once for the loop (``memory="offload"`` releases them after)."""
        nets = list({c.net.component.name: c.net.component for c in self.controls}.values())

        def nest(index: int) -> T:
            if index == len(nets):
                return run()

            def with_compiled(compiled: CompiledModel) -> T:
                self._compiled[nets[index].name] = compiled
                return nest(index + 1)

            return nets[index].use(with_compiled)

        try:
            return nest(0)
        finally:
            self._compiled.clear()

    def extra_feeds(self, step: Step) -> Mapping[str, np.ndarray]:
        total: list[np.ndarray] | None = None
        for control in self.controls:
            scale = control.scale_at(step.index, step.total)
            if scale == 0.0:
                continue
            residuals = [r * np.float32(scale) for r in self.residuals(control, step)]
            total = residuals if total is None else [a + b for a, b in zip(total, residuals, strict=True)]
        if total is None:
            batch, _, height, width = step.model_input.shape
            shapes = self.controls[0].net.residual_shapes(batch, height, width)
            total = [np.zeros(shape, dtype=np.float32) for shape in shapes]
        return unet_feeds(total)

    def residuals(self, control: ActiveControl, step: Step) -> list[np.ndarray]:
        """One ControlNet's residuals at scale 1, in the UNet's input order."""
        net = control.net
        compiled = self._compiled[net.component.name]
        batch = step.model_input.shape[0]
        reps = batch // control.image.shape[0]
        feeds = {
            NAMES.sample: step.model_input,
            NAMES.timestep: timestep_feed(compiled, float(step.timestep), batch, NAMES, net.component.name),
            COND_INPUT: np.tile(control.image, (reps, 1, 1, 1)),
        }
        for info in compiled.inputs:
            if info.name not in feeds:
                if info.name not in step.feeds:
                    raise ModelFormatError(
                        f"ControlNet {net.name!r} needs an input {info.name!r} this pipeline does not give "
                        "(a ControlNet for another model family?)"
                    )
                feeds[info.name] = step.feeds[info.name]
        if net.name not in self._checked:
            _check_fit(net, compiled, feeds)
        outputs = _run_all(compiled, feeds, batch, net.component.name)
        names = [o.name for o in compiled.outputs]
        down = sorted(
            (n for n in names if n.startswith("down_block_res_sample_")), key=lambda n: int(n.rsplit("_", 1)[1])
        )
        residuals = [outputs[n] for n in down] + [outputs["mid_block_res_sample"]]
        if net.name not in self._checked:
            _check_shapes(net, residuals, step)
            self._checked.add(net.name)
        return [np.asarray(r, dtype=np.float32) for r in residuals]


def unet_feeds(residuals: list[np.ndarray]) -> dict[str, np.ndarray]:
    """ControlNet residuals (down blocks in order, then the mid block) as the UNet's inputs."""
    feeds = {f"down_block_additional_residual_{i}": r for i, r in enumerate(residuals[:-1])}
    feeds["mid_block_additional_residual"] = residuals[-1]
    return feeds


def _check_fit(net: ControlNet, compiled: CompiledModel, feeds: Mapping[str, np.ndarray]) -> None:
    """Fixed dimensions of the ControlNet's inputs against what the pipeline feeds it: a
    ControlNet for another family (prompt width 768 vs 1024 vs 2048) or a fixed-size export."""
    for info in compiled.inputs:
        value = feeds[info.name]
        dims = list(info.shape)
        if len(dims) != value.ndim or any(
            isinstance(d, int) and d > 0 and d != v for d, v in zip(dims, value.shape, strict=False)
        ):
            wanted = ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims)
            raise ModelFormatError(
                f"ControlNet {net.name!r} takes {info.name} [{wanted}], this pipeline gives {list(value.shape)}: "
                "a ControlNet for another model family, or exported for another size"
            )
    if "mid_block_res_sample" not in {o.name for o in compiled.outputs}:
        raise ModelFormatError(f"ControlNet {net.name!r} has no output 'mid_block_res_sample'")


def _check_shapes(net: ControlNet, residuals: list[np.ndarray], step: Step) -> None:
    batch, _, height, width = step.model_input.shape
    expected = net.residual_shapes(batch, height, width)
    got = [tuple(r.shape) for r in residuals]
    if got != expected:
        raise ModelFormatError(
            f"ControlNet {net.name!r} returns residuals {got}, but its config.json describes {expected}"
        )


def _run_all(
    compiled: CompiledModel, feeds: Mapping[str, np.ndarray], batch: int, component: str
) -> dict[str, np.ndarray]:
    """Every output, in chunks when the graph fixes a smaller batch than the guidance batch."""
    chunk = fixed_batch(compiled, NAMES.sample) or batch
    if batch % chunk:
        raise InputError(f"the {component} model takes batches of {chunk}; {batch} cannot be split into them")
    if chunk == batch:
        return dict(compiled.run(feeds))
    parts = []
    for start in range(0, batch, chunk):
        part = {k: (v[start : start + chunk] if v.ndim and v.shape[0] == batch else v) for k, v in feeds.items()}
        parts.append(compiled.run(part))
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}
