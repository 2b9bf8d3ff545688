"""LoRAs, textual-inversion embeddings and a standalone VAE on a pipeline loaded from a checkpoint.

``Adapters`` holds what the user chose (``Pipeline.set_loras``, ``load_embedding``, ``set_vae``)
and turns it into each component's weights over the checkpoint's base weights, which are never
changed: LoRA deltas merged into fresh arrays (``sdkit.families.lora``), embedding rows written
into a fresh token table (grown, with the graph's table declared larger, when the new ids pass
its end), the VAE file's tensors instead of the checkpoint's. ``Component.set_weights`` then
refits a compiled engine in place where its backend can (ggml, TensorRT, reference), else the
component compiles again on its next use. With nothing chosen, each component returns to its
source's own weights: the base, bit for bit.

``prompt_loras`` reads A1111's ``<lora:name:strength>`` tags from a prompt, for the CLI's
``--lora-dir``; the tokenizer leaves the tags out of the text it encodes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from sdkit.errors import InputError, ModelFormatError
from sdkit.families import MappedCheckpoint
from sdkit.families.clip_tokenizer import ClipTokenizerBase
from sdkit.families.embeddings import TOKEN_TABLE, Embedding, embedding_rows, open_embedding
from sdkit.families.lora import merge_loras
from sdkit.families.lora_file import LoraFile, open_lora
from sdkit.families.vae_file import VAE_COMPONENTS, VaeFile, open_vae
from sdkit.model import Graph, Model, WeightSet
from sdkit.pipelines.stages.sources import GraphWithWeights, ModelSource

if TYPE_CHECKING:
    from sdkit.pipelines.stages.components import Component, WeightSwap

LORA_TAG = re.compile(r"<(?:lora|lyco):([^:<>]+)(?::([^:<>]*))?(?::[^<>]*)?>", re.IGNORECASE)
LoraSpec = tuple[str | os.PathLike[str], float]


def resized_graph(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    """``graph`` with the initializers ``shapes`` names declared with those shapes (their graph
    inputs too: the shipped graphs keep initializers as inputs)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.proto)
    for tensor in proto.graph.initializer:
        if tensor.name in shapes:
            del tensor.dims[:]
            tensor.dims.extend(shapes[tensor.name])
    for value in proto.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name], strict=True):
                dim.Clear()
                dim.dim_value = int(size)
    return Graph(proto)


@dataclass(frozen=True, eq=False)
class GrownTableSource:
    """A text encoder's source with a token table of ``rows`` rows (new rows zero until an
    embedding's vectors are set): for embedding ids past the end of the checkpoint's table."""

    source: ModelSource
    rows: int

    def describe(self) -> str:
        return f"{self.source.describe()} (+{self.rows} token rows)"

    def load(self) -> Model:
        model = self.source.load()
        table = model.weights[TOKEN_TABLE]
        shape = (self.rows, int(table.shape[1]))
        weights = model.weights.entries()
        weights[TOKEN_TABLE] = embedding_rows(np.asarray(table), {}, self.rows)
        return Model(resized_graph(model.graph, {TOKEN_TABLE: shape}), WeightSet(weights), model.path)


def base_sources(mapped: MappedCheckpoint) -> dict[str, ModelSource]:
    """Each component's source with the checkpoint's own weights (as the single-file loader
    makes them: the family's weightless graph and the lazily mapped weights); an optional
    component the files lack (``MappedCheckpoint.absent``) has none."""
    label = mapped.checkpoint.path.name
    return {
        name: GraphWithWeights(component.load_graph, mapped.weights[name], f"{label} ({name})")
        for name, component in mapped.family.components.items()
        if name in mapped.weights
    }


def _tokenizer_of(tokenizers: Mapping[str, ClipTokenizerBase], component: str) -> ClipTokenizerBase:
    if component not in tokenizers:
        raise ModelFormatError(f"this pipeline has no tokenizer for {component}; embeddings need one")
    return tokenizers[component]


@dataclass
class Adapters:
    """A pipeline's LoRAs (with strengths), embeddings and VAE; ``apply`` sets the weights."""

    loras: list[tuple[LoraFile, float]] = field(default_factory=list)
    embeddings: list[Embedding] = field(default_factory=list)
    vae_file: VaeFile | None = None  # set_vae's file: its weights per component, the encoder it lacks
    _merged: dict[str, dict[str, np.ndarray]] | None = None
    _grown: dict[str, int] = field(default_factory=dict)  # component -> rows of its grown table
    _changed: set[str] = field(default_factory=set)  # components whose weights differ from the base

    def set_loras(self, loras: Sequence[LoraSpec], mapped: MappedCheckpoint) -> None:
        """Read and check the LoRA files against ``mapped``'s family, then merge them (all or none)."""
        opened = []
        for path, strength in loras:
            try:
                value = float(strength)
            except (TypeError, ValueError):
                value = float("nan")
            if not np.isfinite(value):
                raise InputError(f"LoRA strength must be a finite number, got {strength!r} for {path}")
            opened.append((open_lora(path), value))
        merged = merge_loras(mapped.family, mapped.weights, opened)
        self.loras, self._merged = opened, merged

    @property
    def vae(self) -> dict[str, WeightSet]:
        """Component -> the VAE file's weights (none without a VAE file)."""
        return self.vae_file.weights if self.vae_file is not None else {}

    @property
    def active(self) -> bool:
        return bool(self.loras or self.embeddings or self.vae)

    def forget(self, component: str) -> None:
        """A component left the pipeline (``set_vae``'s decoder-only file dropped the encoder):
        nothing is recorded as set on it."""
        self._grown.pop(component, None)
        self._changed.discard(component)

    def refresh(self, mapped: MappedCheckpoint) -> None:
        """Merge the LoRAs again on another base (after ``set_checkpoint``, which gave every
        component its new source)."""
        self._grown, self._changed = {}, set()
        self._merged = merge_loras(mapped.family, mapped.weights, self.loras) if self.loras else None

    def component_weights(
        self, mapped: MappedCheckpoint, tokenizers: Mapping[str, ClipTokenizerBase], vae: Mapping[str, WeightSet]
    ) -> dict[str, dict[str, np.ndarray]]:
        """Component -> the weights that differ from the checkpoint's."""
        weights: dict[str, dict[str, np.ndarray]] = {c: dict(w) for c, w in (self._merged or {}).items()}
        for component, lazy in vae.items():
            weights[component] = {name: lazy[name] for name in lazy}
        rows: dict[str, dict[int, np.ndarray]] = {}
        for embedding in self.embeddings:
            for component, vectors in embedding.vectors.items():
                ids = _tokenizer_of(tokenizers, component).add_embedding(embedding.name, embedding.count)
                rows.setdefault(component, {}).update(zip(ids, vectors, strict=True))
        for component, new_rows in rows.items():
            table = weights.get(component, {}).get(TOKEN_TABLE)
            base = np.asarray(mapped.weights[component][TOKEN_TABLE] if table is None else table)
            weights.setdefault(component, {})[TOKEN_TABLE] = embedding_rows(base, new_rows)
        return weights

    def apply(
        self,
        mapped: MappedCheckpoint,
        components: Mapping[str, Component],
        tokenizers: Mapping[str, ClipTokenizerBase],
    ) -> dict[str, WeightSwap]:
        """Hand every component its weights; returns ``"refit"`` or ``"recompile"`` for each
        component whose weights changed (one with the base weights before and after is left alone)."""
        weights = self.component_weights(mapped, tokenizers, self.vae)
        sources = base_sources(mapped)
        swaps: dict[str, WeightSwap] = {}
        for name, component in components.items():
            changed = weights.get(name)
            table = changed.get(TOKEN_TABLE) if changed else None
            base = mapped.weights.get(name)  # None: a VAE encoder the VAE file alone gives
            base_rows = base.spec(TOKEN_TABLE)[0][0] if base is not None and TOKEN_TABLE in base else 0
            rows = int(table.shape[0]) if table is not None and table.shape[0] > base_rows else 0
            if rows != self._grown.get(name, 0) and name in sources:
                source = sources[name] if not rows else GrownTableSource(sources[name], rows)
                component.set_source(source)
                self._grown[name] = rows
            elif not changed and name not in self._changed:
                continue
            swaps[name] = component.set_weights(changed or None)
            self._changed.discard(name)
            if changed:
                self._changed.add(name)
        return swaps


def lora_files(lora_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """The LoRA (and LyCORIS) files of an A1111 ``models/Lora`` folder by the name a prompt's tag
    gives them: the file's stem, and its path inside the folder without the suffix (``sub/ink``).
    A file whose real path leaves the folder (a link out of it) is left out; with two files of one
    stem, the first in sorted path order (the folder's top level first) answers to the stem."""
    folder = Path(lora_dir).expanduser()
    root = folder.resolve()
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.safetensors"), key=lambda p: (len(p.relative_to(folder).parts), p)):
        if not path.is_file() or not path.resolve().is_relative_to(root):
            continue
        found.setdefault(path.relative_to(folder).with_suffix("").as_posix(), path)
        found.setdefault(path.stem, path)
    return found


def lora_tag_strength(name: str, text: str) -> float:
    """A tag's strength: a finite number (``nan`` and ``inf`` are refused)."""
    try:
        strength = float(text)
    except ValueError:
        raise InputError(f"<lora:{name}:{text}>: the strength must be a number") from None
    if not np.isfinite(strength):
        raise InputError(f"<lora:{name}:{text}>: the strength must be a finite number")
    return strength


def prompt_loras(prompt: str, lora_dir: str | os.PathLike[str]) -> list[tuple[Path, float]]:
    """The LoRAs a prompt's A1111 tags name (``<lora:name>``, ``<lora:name:0.8>``), as files
    ``<lora_dir>/**/<name>.safetensors`` (``lora_files``: sub-folders searched as A1111 does,
    ``sub/name`` too) with strengths. A name is a file of the folder or an ``InputError``: ``../``,
    an absolute path or a link out of the folder never reaches a file outside it."""
    found: list[tuple[Path, float]] = []
    folder = Path(lora_dir).expanduser()
    files: dict[str, Path] | None = None
    for match in LORA_TAG.finditer(prompt):
        name, text = match.group(1).strip(), (match.group(2) or "1").strip()
        strength = lora_tag_strength(name, text)
        files = lora_files(folder) if files is None else files
        path = files.get(name)
        if path is None:
            stem = Path(name).name
            pickled = [p for p in (*folder.rglob("*.pt"), *folder.rglob("*.ckpt")) if p.stem == stem]
            why = f" (only {sorted(pickled)[0].name}: pickles are refused)" if pickled else ""
            raise InputError(f"<lora:{name}> in the prompt: no {name}.safetensors in the LoRA folder{why}")
        found.append((path, strength))
    return found


class AdapterMethods:
    """``set_loras``, ``load_embedding`` and ``set_vae`` of ``Pipeline`` (for pipelines loaded
    from a checkpoint file or diffusers folder, whose weights map by name)."""

    checkpoint: MappedCheckpoint | None
    components: dict[str, Component]
    adapters: Adapters
    # sources -> their components, made as at load (None: this pipeline cannot add one)
    _make_components: Callable[[dict[str, ModelSource]], dict[str, Component]] | None

    def text_tokenizers(self) -> dict[str, ClipTokenizerBase]:
        """Text-encoder component -> its tokenizer: a ``tokenizers`` mapping where the pipeline
        has one, else the ``tokenizer`` / ``tokenizer_2`` attributes."""
        found: dict[str, ClipTokenizerBase] = {}
        mapping = getattr(self, "tokenizers", None)
        if isinstance(mapping, Mapping):
            found.update({n: t for n, t in mapping.items() if isinstance(t, ClipTokenizerBase)})
        for attribute, component in (("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2")):
            tokenizer = getattr(self, attribute, None)
            if isinstance(tokenizer, ClipTokenizerBase) and component not in found:
                found[component] = tokenizer
        return {n: t for n, t in found.items() if n in self.components}

    def _mapped(self, what: str) -> MappedCheckpoint:
        if self.checkpoint is None:
            raise ModelFormatError(
                f"{what} need a pipeline loaded from a .safetensors checkpoint or a diffusers folder "
                "(an ONNX export's weights do not keep the layer names they map to)"
            )
        return self.checkpoint

    def apply_adapters(self) -> dict[str, WeightSwap]:
        """Set every component's weights from the chosen LoRAs, embeddings and VAE."""
        return self.adapters.apply(self._mapped("adapters"), self.components, self.text_tokenizers())

    def set_loras(self, loras: Sequence[LoraSpec]) -> dict[str, WeightSwap]:
        """Use these LoRAs (``[(path, strength), ...]``; ``[]``: none) merged into fresh copies
        of the checkpoint's weights; each compiled component is refit where its backend can
        (``"refit"``), else compiled again on its next use (``"recompile"``)."""
        self.adapters.set_loras(list(loras), self._mapped("LoRAs"))
        return self.apply_adapters()

    def load_embedding(self, path: str | os.PathLike[str], name: str | None = None) -> dict[str, WeightSwap]:
        """Load a textual-inversion embedding; ``name`` (default: the file's stem, as A1111) in
        a prompt triggers it."""
        embedding = open_embedding(path, self._mapped("embeddings").family, name)
        replaced = any(e.name == embedding.name for e in self.adapters.embeddings)
        self.adapters.embeddings = [e for e in self.adapters.embeddings if e.name != embedding.name]
        self.adapters.embeddings.append(embedding)
        if replaced:  # its trigger's tokens may change count: register every embedding afresh
            self.reset_tokenizers()
        return self.apply_adapters()

    def unload_embeddings(self, names: Sequence[str] | None = None) -> dict[str, WeightSwap]:
        """Remove the named embeddings (None: all of them): their triggers are plain text again
        and, with none left, the text encoders have the checkpoint's token table, bit for bit."""
        self._mapped("embeddings")
        loaded = [e.name for e in self.adapters.embeddings]
        wanted = loaded if names is None else [str(n) for n in ([names] if isinstance(names, str) else names)]
        missing = [n for n in wanted if n not in loaded]
        if missing:
            raise InputError(f"no embedding {missing[0]!r} is loaded (loaded: {', '.join(loaded) or 'none'})")
        self.adapters.embeddings = [e for e in self.adapters.embeddings if e.name not in wanted]
        # A tokenizer cannot forget added tokens: fresh ones, the remaining embeddings added again.
        self.reset_tokenizers()
        return self.apply_adapters()

    def reset_tokenizers(self) -> None:
        """Replace the text encoders' tokenizers with fresh ones, without embedding tokens (the
        pipeline classes that load embeddings implement it)."""
        raise ModelFormatError(f"{type(self).__name__} cannot reset its tokenizers")

    def set_vae(self, path: str | os.PathLike[str] | None) -> dict[str, WeightSwap]:
        """Use a standalone VAE file (LDM or diffusers keys) instead of the checkpoint's VAE;
        ``None``: the checkpoint's again. Both halves come from the one file, as in A1111 and
        ComfyUI: a file with the encoder gives img2img its encoder (made as at load where the
        checkpoint had none); a decoder-only file drops the checkpoint's encoder (released), and
        img2img is then refused naming the key the file lacks, until a VAE file with its encoder
        (or ``None``: the checkpoint's VAE) is set."""
        mapped = self._mapped("VAE files")
        self.adapters.vae_file = open_vae(path, mapped.family) if path is not None else None
        self.sync_optional_components(mapped, base_sources(mapped))
        return self.apply_adapters()

    def absent_components(self, mapped: MappedCheckpoint) -> dict[str, str]:
        """The optional components this pipeline runs without -> the first key missing: the
        checkpoint's (``MappedCheckpoint.absent``); with a VAE file (``set_vae``) the VAE's are
        the file's alone (its encoder, if it lacks it, under the file's own key)."""
        absent = dict(mapped.absent)
        vae = self.adapters.vae_file
        if vae is not None:
            for name in VAE_COMPONENTS:
                absent.pop(name, None)
            absent.update(vae.absent)
        return absent

    def sync_optional_components(self, mapped: MappedCheckpoint, sources: Mapping[str, ModelSource]) -> None:
        """Release and drop the optional components the checkpoint and VAE file now lack
        (``absent_components``); make, as at load, those they fill and the pipeline lacks (the
        VAE file's encoder where the checkpoint has none: its weights are the source)."""
        absent = self.absent_components(mapped)
        wanted = dict(sources)
        vae = self.adapters.vae_file
        if vae is not None:
            for name, weights in vae.weights.items():
                if name not in wanted:
                    graph = mapped.family.components[name].load_graph
                    wanted[name] = GraphWithWeights(graph, weights, f"{vae.path.name} ({name})")
        for name in absent:
            wanted.pop(name, None)
            if name in self.components:
                self.components.pop(name).release()
                self.adapters.forget(name)
        added = {n: s for n, s in wanted.items() if n not in self.components}
        if added and self._make_components is not None:
            self.components.update(self._make_components(added))
