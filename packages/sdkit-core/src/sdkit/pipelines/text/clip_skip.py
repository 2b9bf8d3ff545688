"""Clip skip: the text encoder's hidden states a few layers before the ones the pipeline reads.

A1111 counts it ("Clip skip", ``CLIP_stop_at_last_layers``): 1 is the layer the model was trained
with, 2 the one before it, and so on. diffusers' ``clip_skip`` is the same choice counted from 0
(A1111's ``N`` is diffusers' ``clip_skip=N - 1``), and both read it the same way:

- an encoder read at ``last_hidden_state`` (SD 1.x's CLIP-L, SD 2.x's OpenCLIP-H): the hidden
  states after layer ``L + 1 - N`` (``hidden_states.{L + 1 - N}`` of an optimum export, ``L`` its
  layer count), then the encoder's final layer norm, as A1111's
  ``final_layer_norm(hidden_states[-N])`` and diffusers' ``final_layer_norm(hidden_states[-(clip_skip + 1)])``;
- an encoder read at a hidden layer ``hidden_states.{k}`` (SDXL's two: ``k = L - 1``, the
  penultimate): ``hidden_states.{k + 1 - N}``, without the norm, as diffusers'
  ``hidden_states[-(clip_skip + 2)]``.

A1111 itself applies the setting to SD 1.x's CLIP-L only (SD 2.x and, unless its
``sdxl_clip_l_skip`` option is set, SDXL ignore it); sdkit applies it to every encoder as diffusers
does. It is a graph change: the encoder's graph gets one more output (a ``LayerNormalization``
with the final norm's own scale, bias and epsilon, or an ``Identity``), compiled like the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from sdkit.errors import InputError, ModelFormatError
from sdkit.model import Graph, Model

if TYPE_CHECKING:
    from sdkit.pipelines.request import GenerationPlan

OUTPUT = "clip_skip_hidden_state"
LAST = "last_hidden_state"


def hidden_layers(graph: onnx.GraphProto) -> int:
    """``L``: the largest ``N`` of the graph's ``hidden_states.N`` outputs (0: it has none)."""
    numbers = [o.name.rpartition(".")[2] for o in graph.output if o.name.startswith("hidden_states.")]
    return max((int(n) for n in numbers if n.isdigit()), default=0)


def with_skipped_layers(model: Model, read: str, skip: int) -> Model:
    """``model`` with the output ``OUTPUT``: what ``read`` (the output the pipeline reads) is with
    A1111's clip skip ``skip`` (see the module docstring)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.graph.proto)
    graph = proto.graph
    layers = hidden_layers(graph)
    if not layers:
        raise ModelFormatError(
            "clip skip needs the text encoder's hidden_states.N outputs, which this graph lacks "
            "(optimum exports them; an export without output_hidden_states does not)"
        )
    start = layers + 1 if read == LAST else int(read.rpartition(".")[2]) + 1
    layer = start - skip
    if layer < 1:
        raise InputError(f"clip_skip {skip} is more than this text encoder's {start - 1} layers")
    source = f"hidden_states.{layer}"
    if read == LAST:
        norm = next((node for node in graph.node if LAST in node.output), None)
        if norm is None or norm.op_type != "LayerNormalization":
            raise ModelFormatError(f"clip skip: the text encoder's {LAST} is not a LayerNormalization's output")
        node = helper.make_node("LayerNormalization", [source, *norm.input[1:]], [OUTPUT], name="clip_skip_norm")
        node.attribute.extend(norm.attribute)
    else:
        node = helper.make_node("Identity", [source], [OUTPUT], name="clip_skip")
    graph.node.append(node)
    info = next(o for o in graph.output if o.name == source)
    output = graph.output.add()
    output.CopyFrom(info)
    output.name = OUTPUT
    return Model(Graph(proto), model.weights, model.path)


def clip_skip_edit(read: str, skip: int) -> Callable[[Model], Model]:
    """The ``Component.set_edit`` change for clip skip ``skip`` of an encoder read at ``read``."""

    def edit(model: Model) -> Model:
        return with_skipped_layers(model, read, skip)

    return edit


def note_clip_skip(plan: GenerationPlan) -> None:
    """A1111's PNG label ``Clip skip: N``, written when N > 1 (as A1111)."""
    if plan.request.clip_skip > 1:
        plan.parameters["Clip skip"] = str(plan.request.clip_skip)
