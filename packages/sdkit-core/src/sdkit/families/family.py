"""``Family``: an architecture sdkit ships graphs for, and how a checkpoint's keys fill them.

A family is plain data plus key mappers (``sdkit.families.keymaps``): its component graphs
(shipped names or weightless ``.onnx`` paths), per checkpoint layout a mapper per component,
the probe tensors that tell it apart from the other families, and the defaults a checkpoint file
does not carry (prediction type, latent channels and scale, native size, the published scheduler
config, the tokenizers). Families are registered through ``sdkit_register_model_families``; a
pipeline loader detects which one a file is (``detect``) and maps its weights (``map``). A family
with a ``FolderSpec`` (``folder``) also reads diffusers/optimum ONNX export folders: the folder
loader (``sdkit.pipelines.loaders.diffusers_folder``) finds the family a folder's ``model_index.json``
names, reads the components and tokenizer folders the spec lists, and takes the family's defaults
where the folder's ``config.json`` files are silent.

The pipeline class is named by a ``"module:attr"`` reference (``pipeline``), as plugins register
classes: families sit below the pipelines in sdkit's layers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from onnx import helper

from sdkit.errors import ModelFormatError
from sdkit.families import shipped
from sdkit.families.checkpoint import Checkpoint
from sdkit.families.clip_tokenizer import TokenizerSource
from sdkit.families.keymaps import KeyMapper, TensorSource
from sdkit.model import Graph, LazyArray, WeightSet

LAYOUT_LABELS = {
    "ldm": "LDM/SGM single file",
    "diffusers": "diffusers",
    "bfl": "BFL original (Flux)",
    "sai": "Stability original (SD3 MMDiT)",
}
# What LDM training files carry besides the modules: EMA copies and the DDPM schedule buffers.
LDM_EXTRA_PREFIXES = ("model_ema.",)
LDM_EXTRA_KEYS = frozenset(
    {
        "betas",
        "alphas_cumprod",
        "alphas_cumprod_prev",
        "sqrt_alphas_cumprod",
        "sqrt_one_minus_alphas_cumprod",
        "log_one_minus_alphas_cumprod",
        "sqrt_recip_alphas_cumprod",
        "sqrt_recipm1_alphas_cumprod",
        "posterior_variance",
        "posterior_log_variance_clipped",
        "posterior_mean_coef1",
        "posterior_mean_coef2",
        "logvar",
        "model.logvar",
    }
)
SHOWN = 5  # names an error or warning lists before "and N more"
# In ``FolderSpec.text_outputs``: the encoder's penultimate hidden states, ``hidden_states.{N - 1}``
# for the ``num_hidden_layers`` N of its ``config.json`` (optimum exports every layer's).
PENULTIMATE = "<penultimate>"


class UnusedKeysWarning(UserWarning):
    """A checkpoint holds tensors that no component of its family reads."""


@lru_cache(maxsize=16)
def _graph(reference: str) -> Graph:
    return shipped.load_graph(reference)


def initializer_specs(graph: Graph) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """Each initializer's shape and dtype, in graph order."""
    return {
        t.name: (tuple(int(d) for d in t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)))
        for t in graph.proto.graph.initializer
    }


@dataclass(frozen=True)
class FamilyComponent:
    """One component of a family: its graph, its key mapper per layout, its probes (graph
    initializer -> shape, derived from the architecture config) that detection checks.
    ``optional``: a component the files may lack altogether (the flow families' VAE encoder,
    img2img's only: a decoder-only VAE file); ``Family.map`` leaves it out when none of its
    weights is there, and refuses the file as for any other component when only some are."""

    graph: str | Path
    layouts: Mapping[str, KeyMapper]
    probes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    optional: bool = False

    def load_graph(self) -> Graph:
        """The weightless graph (read once per process)."""
        return _graph(str(self.graph))


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


@dataclass(frozen=True, eq=False)
class MappedCheckpoint:
    """A checkpoint mapped onto a family: a lazy ``WeightSet`` per component."""

    family: Family
    layout: str
    checkpoint: Checkpoint
    weights: dict[str, WeightSet]
    unknown: tuple[str, ...] = ()
    prediction_type: str = ""  # "" until detection says (the family's, the .yaml's or the user's)
    # The optional components left out (none of their weights in the files): component -> the
    # first key looked for (``vae.encoder.conv_in.weight``), for the error of what needs it.
    absent: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prediction_type:
            object.__setattr__(self, "prediction_type", self.family.prediction_type)


@dataclass(frozen=True)
class FolderSpec:
    """How a diffusers/optimum ONNX export folder of a family looks (``<component>/model.onnx``,
    ``<component>/config.json``, tokenizer folders, ``scheduler/scheduler_config.json``).

    class_names: words of ``model_index.json``'s ``_class_name`` that name the family (``"Flux"``,
        ``"XL"``); markers: components whose listing there names it (SD3's ``text_encoder_3``).
        Folder families are tried highest ``rank`` first (then in registry order); the first whose
        word or marker the index has claims the folder; one with neither claims any folder (SD
        1.x/2.x's, rank 0: the fallback of diffusers' own ONNX exports).
    refused: words of a class name the family claims but does not run (``"Inpaint"``: a variant).
    required / optional: the component folders; ``listed_required``: optional ones that must be
        there when ``model_index.json`` lists them with a class (an SDXL base's ``text_encoder``;
        a refiner has none).
    tokenizers: text encoder -> its tokenizer folder, required where the encoder is there, except
        for the encoders in ``shipped_vocab`` (T5: sdkit ships its vocabulary).
    text_outputs: per text encoder, the outputs the pipeline reads (``PENULTIMATE`` is read from
        the encoder's ``config.json``); an encoder the folder lacks is left out.
    denoiser: the denoiser's component; ``denoiser_keys``: the ``PipelineConfig`` fields its
        ``config.json`` gives where it has them (``sample_size``; SD3's ``patch_size``: Flux's
        config says 1, the 2x2 packing is the pipeline's), the family's otherwise.
    time_ids: SDXL's switches of ``model_index.json`` apply (``force_zeros_for_empty_prompt``,
        ``requires_aesthetics_score``, checked against the UNet's time-embedding width).
    """

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    tokenizers: Mapping[str, str] = field(default_factory=dict)
    text_outputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    class_names: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    rank: int = 0
    refused: tuple[str, ...] = ()
    listed_required: tuple[str, ...] = ()
    shipped_vocab: tuple[str, ...] = ()
    denoiser: str = "unet"
    denoiser_keys: tuple[str, ...] = ("sample_size",)
    time_ids: bool = False

    @property
    def components(self) -> tuple[str, ...]:
        return (*self.required, *self.optional)

    def claims(self, index: Mapping[str, Any]) -> bool:
        """Whether a ``model_index.json`` names this family (see the class docstring)."""
        if not self.class_names and not self.markers:
            return True
        class_name = str(index.get("_class_name", ""))
        return any(word in class_name for word in self.class_names) or any(listed(index, c) for c in self.markers)


def listed(index: Mapping[str, Any], component: str) -> bool:
    """Whether ``model_index.json`` names ``component`` with a class (``[null, null]`` does not)."""
    entry = index.get(component)
    return isinstance(entry, list) and bool(entry) and entry[0] is not None


@dataclass(frozen=True, eq=False)
class Family:
    """A model family. See the module docstring; ``sdkit.families.builtin`` builds SD's."""

    name: str
    label: str
    pipeline: str  # "module:attr" of the pipeline class
    components: Mapping[str, FamilyComponent]
    prediction_type: str = "epsilon"
    scheduler_config: Mapping[str, Any] | None = None
    tokenizers: Mapping[str, TokenizerSource] = field(default_factory=dict)
    text_outputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sample_size: int = 64
    latent_channels: int = 4
    vae_scaling_factor: float = 0.18215
    vae_scale_factor: int = 8
    # SDXL's switches (PipelineConfig's fields of the same names): an empty negative prompt as
    # zeros (base), aesthetic-score time ids (refiner), the VAE kept in fp32 (it overflows in fp16).
    force_zeros_for_empty_prompt: bool = False
    requires_aesthetics_score: bool = False
    fp32_components: tuple[str, ...] = ()
    # An inpainting denoiser: its sample is the latents, the mask and the masked image's latents
    # (2 * latent_channels + 1 channels); PipelineConfig.inpainting.
    inpainting: bool = False
    priority: int = 0  # among families a file matches equally, the higher is the default
    # Components a file of this family does not hold, each from its own file (Flux's transformer
    # files): option name (``clip_l``: ``load_pipeline(..., clip_l=PATH)``, ``--clip_l PATH``) ->
    # what it is. Their keys are read under ``<name>.`` (``Checkpoint.with_files``).
    files: Mapping[str, str] = field(default_factory=dict)
    # Of those, the ones a file of the family may hold itself (SD3's all-in-one files): option ->
    # the key prefix it holds the component under. Such a component's file is needed only when the
    # checkpoint has no key there; a given one is read under that prefix, replacing the file's own.
    embedded: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)  # more PipelineConfig fields (flow models')
    # How the family's diffusers/optimum ONNX export folders look; None: single files only.
    folder: FolderSpec | None = None

    def file_prefix(self, option: str) -> str:
        """The key prefix a component file given as ``option`` is read under."""
        return self.embedded.get(option, f"{option}.")

    def held(self, checkpoint: Checkpoint) -> list[str]:
        """The component-file options whose component ``checkpoint`` holds itself (``embedded``)."""
        return [n for n, prefix in self.embedded.items() if any(k.startswith(prefix) for k in checkpoint)]

    def layouts(self) -> list[str]:
        """The checkpoint layouts every component has a mapper for."""
        found = [set(c.layouts) for c in self.components.values()]
        common = set.intersection(*found) if found else set()
        return [layout for layout in LAYOUT_LABELS if layout in common] + sorted(common - set(LAYOUT_LABELS))

    def mapper(self, component: str, layout: str) -> KeyMapper:
        return self.components[component].layouts[layout]

    def detect(self, checkpoint: Checkpoint) -> str | None:
        """The layout in which ``checkpoint`` has every probe tensor with its shape, or None."""
        for layout in self.layouts():
            if all(self._probes_match(checkpoint, name, layout) for name in self.components):
                return layout
        return None

    def _probes_match(self, checkpoint: Checkpoint, component: str, layout: str) -> bool:
        mapper = self.mapper(component, layout)
        for name, shape in self.components[component].probes.items():
            source = mapper.source(name, shape)
            key = checkpoint.find(source) if source else None
            if key is None or not source or not source.stored_shape_fits(checkpoint.entry(key).shape, shape):
                return False
        return True

    def key_map(self, component: str, layout: str) -> dict[str, TensorSource]:
        """Graph initializer -> where a ``layout`` checkpoint stores it, for every initializer
        of the component's graph (the seam LoRA and VAE files use)."""
        specs = initializer_specs(self.components[component].load_graph())
        return {name: self.key_map_entry(component, layout, name, shape) for name, (shape, _) in specs.items()}

    def map(self, checkpoint: Checkpoint, layout: str) -> MappedCheckpoint:
        """Every component's weights from ``checkpoint`` (lazy, converted to the graphs' dtypes
        on access), checked complete: each initializer found with its shape, else one
        ``ModelFormatError`` naming the missing ones; keys nothing reads are warned about. An
        ``optional`` component none of whose weights is there is left out (``absent``)."""
        used: set[str] = set()
        problems: list[str] = []
        weights: dict[str, WeightSet] = {}
        absent: dict[str, str] = {}
        short: dict[str, tuple[int, int]] = {}  # component -> (weights missing, weights it has)
        for component, spec in self.components.items():
            entries: dict[str, LazyArray] = {}
            specs = initializer_specs(spec.load_graph())
            before, found = len(problems), False
            for name, (shape, dtype) in specs.items():
                source = self.key_map_entry(component, layout, name, shape)
                key = checkpoint.find(source)
                if key is None:
                    problems.append(f"{source.key} (missing)")
                    continue
                found = True
                stored = checkpoint.entry(key).shape
                if not source.stored_shape_fits(stored, shape):
                    problems.append(f"{key} (shape {list(stored)}, the {component} needs {list(shape)})")
                    continue
                used.add(key)
                entries[name] = checkpoint.tensor(key, source, shape, dtype)
            if spec.optional and not found and len(problems) > before:
                absent[component] = problems[before].removesuffix(" (missing)")
                del problems[before:]
                continue
            weights[component] = WeightSet(entries)
            if len(problems) > before:
                short[component] = (len(problems) - before, len(specs))
        unknown = self._unknown(checkpoint, layout, used)
        name = checkpoint.path.name
        if problems:
            hint = f"; keys in the file that nothing reads: {_listed(unknown)}" if unknown else ""
            which = ", ".join(f"the {c}'s {n} of {total}" for c, (n, total) in short.items())
            raise ModelFormatError(
                f"{name} is not a complete {self.label} checkpoint ({LAYOUT_LABELS.get(layout, layout)}): "
                f"{len(problems)} weight(s) missing or mis-shaped ({which}): {_listed(problems)}{hint}"
            )
        if unknown:
            message = f"{name}: {len(unknown)} tensor(s) that no {self.label} component reads: {_listed(unknown)}"
            warnings.warn(message, UnusedKeysWarning, stacklevel=2)
        return MappedCheckpoint(self, layout, checkpoint, weights, tuple(unknown), absent=absent)

    def key_map_entry(self, component: str, layout: str, name: str, shape: Sequence[int]) -> TensorSource:
        """Where one graph initializer is stored in a ``layout`` checkpoint."""
        source = self.mapper(component, layout).source(name, shape)
        if source is None:
            raise ModelFormatError(f"family {self.name!r}: no {layout} key rule for {component} weight {name!r}")
        return source

    def _unknown(self, checkpoint: Checkpoint, layout: str, used: set[str]) -> list[str]:
        mappers = [self.mapper(c, layout) for c in self.components]
        unknown = []
        for key in checkpoint:
            if key in used or key in LDM_EXTRA_KEYS or key.startswith(LDM_EXTRA_PREFIXES):
                continue
            owners = [m for m in mappers if key.startswith(m.prefix)]
            if owners and any(m.ignored(key) for m in owners):
                continue
            unknown.append(key)
        return unknown
