"""LoRA merging: the graph weights a LoRA file changes and their new values.

``lora_targets(family)`` names, for every weight of the family's graphs, each spelling a LoRA
file may use for its layer (built from the graph side, because kohya's ``_`` for ``.`` is
ambiguous: ``self_attn``, ``to_out_0``): the diffusers/transformers module path (PEFT, older
diffusers, kohya's SD 1.x names), the same under ``lora_unet_`` / ``lora_te*_`` with ``_``, and
for the UNet the LDM/SGM path the family's ``ldm`` key map gives (kohya's SDXL names:
``lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q``).

``merge_loras(family, base, loras)`` returns fresh arrays ``W + sum(strength * alpha / rank *
up @ down)`` (convs contracted over the rank: LoCon; LyCORIS LoHa ``(w1_a @ w1_b) * (w2_a @
w2_b)`` and LoKr ``kron(w1, w2)`` in place of ``up @ down``) for the weights the LoRAs touch, computed
in float32 from the base weights, which are never changed: dropping the LoRAs is using the base
arrays again, bit for bit. A LoRA whose modules match no weight of the family, or whose matrices
do not fit the weight they name, is one ``ModelFormatError``; modules that match nothing in a
file that otherwise fits are reported by name (``UnusedLoraKeysWarning``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families.family import SHOWN, Family, initializer_specs
from sdkit.families.lora_file import LoraFile, LoraModule

if TYPE_CHECKING:
    from sdkit.model import WeightSet

KOHYA_COMPONENT_PREFIXES = {
    "unet": ("lora_unet_",),
    "text_encoder": ("lora_te_", "lora_te1_"),
    "text_encoder_2": ("lora_te2_",),
}


class UnusedLoraKeysWarning(UserWarning):
    """A LoRA file holds modules that no weight of the pipeline's family has."""


@dataclass(frozen=True)
class Target:
    """A graph weight a LoRA module changes."""

    component: str
    name: str  # graph initializer
    shape: tuple[int, ...]


_TARGETS: dict[int, dict[str, Target]] = {}


def _spellings(family: Family, component: str, name: str) -> list[str]:
    module = name.removesuffix(".weight")
    found = [f"{component}.{module}"]
    if module.startswith("text_model."):
        found.append(f"{component}.{module.removeprefix('text_model.')}")
    if component == "unet":
        found.append(module)  # diffusers files of the UNet alone carry no "unet." prefix
    paths = [module]
    if component == "unet" and "ldm" in family.components[component].layouts:
        mapper = family.mapper(component, "ldm")
        source = mapper.source(name, ())
        if source is not None:
            paths.append(source.key.removeprefix(mapper.prefix).removesuffix(".weight"))
    for prefix in KOHYA_COMPONENT_PREFIXES.get(component, ()):
        found.extend(prefix + path.replace(".", "_") for path in paths)
    return found


def lora_targets(family: Family) -> dict[str, Target]:
    """LoRA module spelling -> the graph weight it adapts (Linear and conv weights of every
    component but the VAE), for ``family``; computed once per family."""
    cached = _TARGETS.get(id(family))
    if cached is not None:
        return cached
    targets: dict[str, Target] = {}
    for component, spec in family.components.items():
        if component.startswith("vae"):
            continue
        for name, (shape, _) in initializer_specs(spec.load_graph()).items():
            if name.endswith(".weight") and len(shape) in (2, 4):
                for spelling in _spellings(family, component, name):
                    targets.setdefault(spelling, Target(component, name, shape))
    _TARGETS[id(family)] = targets
    return targets


def _lora_product(lora: LoraFile, module: LoraModule) -> tuple[np.ndarray, tuple[int, ...]]:
    """``up @ down`` as ``[out, in * kh * kw]`` and the layer's ``(in, kh, kw)`` per the down."""
    down, up = lora.tensor(module.down), lora.tensor(module.up)
    rank = down.shape[0]
    if (up.ndim == 4 and up.shape[2:] != (1, 1)) or up.shape[1] != rank:
        raise ModelFormatError(
            f"{lora.path.name}: module {module.name} has up {list(up.shape)} and down {list(down.shape)}, "
            "not a rank-r pair"
        )
    return up.reshape(up.shape[0], rank) @ down.reshape(rank, -1), tuple(down.shape[1:])


def _factor(lora: LoraFile, module: LoraModule, index: int) -> np.ndarray:
    """LoKr's ``w1``/``w2``: stored whole, or as ``w_a @ w_b`` (``w_b`` may be a conv's 4-D)."""
    whole = module.parts.get(f"w{index}")
    if whole:
        return lora.tensor(whole)
    a, b = lora.tensor(module.parts[f"w{index}_a"]), lora.tensor(module.parts[f"w{index}_b"])
    product: np.ndarray = a @ b.reshape(b.shape[0], -1)
    return product


def _product(lora: LoraFile, module: LoraModule) -> tuple[np.ndarray, tuple[int, ...]]:
    """The unscaled delta as ``[out, in * kh * kw]`` and the ``(in, kh, kw)`` it claims."""
    if module.kind == "lora":
        return _lora_product(lora, module)
    if module.kind == "loha":  # Hadamard product of two low-rank products
        w1 = lora.tensor(module.parts["w1_a"]) @ lora.tensor(module.parts["w1_b"])
        w2 = lora.tensor(module.parts["w2_a"]) @ lora.tensor(module.parts["w2_b"])
        if w1.shape != w2.shape:
            raise ModelFormatError(f"{lora.path.name}: LoHa module {module.name} has factors of different shapes")
        return w1 * w2, (w1.shape[1],)
    w1, w2 = _factor(lora, module, 1), _factor(lora, module, 2)  # LoKr: a Kronecker product
    if w2.ndim == 4:
        w2 = w2.reshape(w2.shape[0], -1)
    product = np.kron(w1, w2)
    return product, (product.shape[1],)


def _delta(lora: LoraFile, module: LoraModule, target: Target, strength: float) -> np.ndarray:
    """``strength * alpha / rank`` times the module's product, in the target's shape (a new array)."""
    wanted = target.shape
    product, tail = _product(lora, module)
    out_in = (wanted[0], int(np.prod(wanted[1:])))
    squeezed = [d for d in tail if d != 1]
    fits = product.shape == out_in and (len(tail) == 1 or squeezed == [d for d in wanted[1:] if d != 1])
    if not fits:
        shape = f"[{product.shape[0]}, {'x'.join(map(str, tail))}]"
        raise ModelFormatError(
            f"{lora.path.name} does not fit this model: module {module.name} is {shape}, the "
            f"{target.component} weight {target.name} is {list(wanted)} (a LoRA made for another model family?)"
        )
    product *= np.float32(strength * lora.scale(module))  # the product is ours: scaled in place
    return product.reshape(wanted)


def _matched(lora: LoraFile, family: Family) -> list[tuple[LoraModule, Target]]:
    targets = lora_targets(family)
    matched = [(m, targets[m.name]) for m in lora.modules.values() if m.name in targets]
    missed = [m for m in lora.modules if m not in targets] + lora.unknown
    if not matched:
        shown = ", ".join(missed[:SHOWN])
        raise ModelFormatError(
            f"{lora.path.name} is not a LoRA for {family.label}: none of its {len(lora.modules)} modules "
            f"names a layer of it ({shown}...)"
        )
    if missed:
        more = f" and {len(missed) - SHOWN} more" if len(missed) > SHOWN else ""
        warnings.warn(
            f"{lora.path.name}: {len(missed)} key(s) match no layer of {family.label} and are ignored: "
            f"{', '.join(missed[:SHOWN])}{more}",
            UnusedLoraKeysWarning,
            stacklevel=3,
        )
    return matched


def lora_deltas(family: Family, loras: Sequence[tuple[LoraFile, float]]) -> dict[tuple[str, str], np.ndarray]:
    """(component, graph weight) -> the float32 change ``sum(strength * alpha / rank * product)``
    the LoRAs make to it (``sdkit merge --lora`` adds it to a checkpoint's stored tensor)."""
    deltas: dict[tuple[str, str], np.ndarray] = {}
    for lora, strength in loras:
        for module, target in _matched(lora, family):
            key = (target.component, target.name)
            change = _delta(lora, module, target, strength)
            if key in deltas:
                deltas[key] += change
            else:
                deltas[key] = change
    return deltas


def merge_loras(
    family: Family, base: Mapping[str, WeightSet], loras: Sequence[tuple[LoraFile, float]]
) -> dict[str, dict[str, np.ndarray]]:
    """Component -> {graph weight: merged float32 array} for every weight the LoRAs change;
    ``base[component]`` is read (fresh arrays from its source), never written."""
    deltas = lora_deltas(family, loras)
    merged: dict[str, dict[str, np.ndarray]] = {}
    for (component, name), delta in deltas.items():
        # The delta array is this function's own: the base weight is added into it, so the base
        # (an in-memory WeightSet hands out its own arrays) is never written.
        np.add(delta, np.asarray(base[component][name], dtype=np.float32), out=delta)
        merged.setdefault(component, {})[name] = delta.astype(base[component].spec(name)[1], copy=False)
    return merged
