"""Prompts -> text-encoder hidden states (and SDXL's pooled embeddings), two ways.

``prompt_weighting="none"`` (the default; diffusers): each prompt is one window of 77 tokens
(start, up to 75 tokens, end, padding), longer prompts cut with a ``PromptTruncatedWarning``;
brackets and ``(word:1.2)`` are plain text. The prompts of a request go through the encoder as
one batch.

``prompt_weighting="a1111"`` (AUTOMATIC1111's defaults): ``sdkit.pipelines.text.prompt_chunks`` splits
each prompt into 75-token chunks (attention syntax parsed by ``prompt_weights``, comma
backtracking, ``BREAK``); each chunk is encoded on its own, weighted with A1111's "Original"
emphasis and concatenated on the token axis (77 * n tokens); the pooled embedding is the first
chunk's. When the prompt and the negative prompt end up with different chunk counts the shorter
is padded with the empty prompt's chunk so both go through the UNet in one batch: A1111's "Pad
prompt/negative prompt" option (its PNG label ``Pad conds: True``, which sdkit then writes).
A1111 without that option runs the two through the UNet separately, which gives a slightly
different image.

SDXL has two encoders; each has its own tokenizer (CLIP-L pads with the end token, OpenCLIP bigG
with ``!``) and its own text (``prompt`` / ``prompt_2``), and the chunk counts are padded to the
largest over both, so their hidden states concatenate on the feature axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sdkit.errors import InputError
from sdkit.pipelines.request import PROMPT_WEIGHTINGS
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.execution import run_main_input, run_outputs
from sdkit.pipelines.text.clip_tokenizer import ClipTokenizerBase
from sdkit.pipelines.text.prompt_chunks import PromptChunk, SpecialTokens, encode_chunks, pad_chunks, prompt_chunks


@dataclass(frozen=True)
class Embeddings:
    """One encoder's output for a list of prompts: ``hidden`` [P, tokens, dim] and, when the
    encoder has a pooled output, ``pooled`` [P, dim2]."""

    hidden: np.ndarray
    pooled: np.ndarray | None = None


@dataclass(frozen=True)
class TextEncoder:
    """A tokenizer and its text-encoder component. ``outputs``: the hidden-state output first,
    then the pooled one when the pipeline reads it (``PipelineConfig.text_outputs``)."""

    component: Component
    tokenizer: ClipTokenizerBase
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.outputs) <= 2:
            raise InputError(f"{self.component.name}: text outputs must be (hidden[, pooled]), got {self.outputs}")

    def run(self, ids: np.ndarray) -> Embeddings:
        """Token ids [P, n] -> hidden states [P, n, dim] (+ pooled [P, dim2])."""
        name, outputs = self.component.name, self.outputs
        if len(outputs) == 1:  # one output: an export that names it differently still works
            hidden = self.component.use(lambda compiled: run_main_input(compiled, "input_ids", ids, outputs, name))
            return Embeddings(np.asarray(hidden, dtype=np.float32))
        out = self.component.use(lambda compiled: run_outputs(compiled, "input_ids", ids, outputs, name))
        return Embeddings(np.asarray(out[outputs[0]], dtype=np.float32), np.asarray(out[outputs[1]], dtype=np.float32))

    def special_tokens(self) -> SpecialTokens:
        comma = self.tokenizer.tokens(",")
        tok = self.tokenizer
        return SpecialTokens(tok.bos_id, tok.eos_id, tok.pad_id, comma[0] if len(comma) == 1 else None)

    def chunks(self, prompt: str) -> list[PromptChunk]:
        """A1111's chunks of ``prompt`` for this tokenizer's window."""
        length = self.tokenizer.model_max_length - 2
        return prompt_chunks(prompt, self.tokenizer.tokens, self.special_tokens(), chunk_length=length)

    def encode_chunked(self, chunks: Sequence[PromptChunk]) -> Embeddings:
        """Chunks -> hidden [1, 77 * n, dim] with emphasis; pooled from the first chunk."""
        pooled: list[np.ndarray] = []

        def encode(ids: np.ndarray) -> np.ndarray:
            result = self.run(ids)
            if result.pooled is not None and not pooled:
                pooled.append(result.pooled)
            return result.hidden

        hidden = encode_chunks(chunks, encode)
        return Embeddings(hidden, pooled[0] if pooled else None)


def encode_prompts(
    encoders: Sequence[TextEncoder], texts: Sequence[Sequence[str]], weighting: str
) -> tuple[list[Embeddings], bool]:
    """``texts[i]`` are the prompts for ``encoders[i]`` (all lists the same length, e.g.
    [negative, positive]). Returns each encoder's ``Embeddings`` (same token count for every
    prompt and encoder) and whether chunk counts had to be padded (A1111's "Pad conds")."""
    if weighting not in PROMPT_WEIGHTINGS:
        raise InputError(f"prompt_weighting must be one of {', '.join(PROMPT_WEIGHTINGS)}, not {weighting!r}")
    if weighting == "none":
        return [enc.run(enc.tokenizer(list(prompts))) for enc, prompts in zip(encoders, texts, strict=True)], False
    chunked = [[enc.chunks(text) for text in prompts] for enc, prompts in zip(encoders, texts, strict=True)]
    count = max(len(chunks) for per_encoder in chunked for chunks in per_encoder)
    padded = any(len(chunks) != count for per_encoder in chunked for chunks in per_encoder)
    results = []
    for enc, per_encoder in zip(encoders, chunked, strict=True):
        empty = enc.chunks("")[0]
        encoded = [enc.encode_chunked(pad_chunks(chunks, count, empty)) for chunks in per_encoder]
        hidden = np.concatenate([e.hidden for e in encoded], axis=0)
        pooled = [e.pooled for e in encoded if e.pooled is not None]
        results.append(Embeddings(hidden, np.concatenate(pooled, axis=0) if pooled else None))
    return results, padded


def uses_emphasis(*prompts: str) -> bool:
    """Whether a prompt has attention brackets (A1111 then writes a non-default ``Emphasis``)."""
    return any("(" in p or "[" in p for p in prompts)
