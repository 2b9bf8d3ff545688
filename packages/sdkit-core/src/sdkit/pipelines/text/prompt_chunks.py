"""Long prompts: A1111's 75-token chunking, or diffusers' truncation, with per-token weights.

CLIP reads 77 tokens: a start token, 75 prompt tokens, an end token. diffusers truncates a longer
prompt; A1111 (``modules/sd_hijack_clip.py``, ``tokenize_line``) splits it into chunks of 75 and
encodes each separately, then concatenates the hidden states along the sequence axis (77 * n
tokens; the UNet's cross-attention takes any length). ``prompt_chunks`` does A1111's split:

1. Parse the prompt's attention syntax (``prompt_weights.parse_prompt_attention``) and tokenize
   each piece on its own (no start/end tokens); every token carries its piece's weight.
2. Walk the tokens, appending to the current chunk. A comma token remembers its position. When
   the chunk is full (75) and the next token is not a comma, and a comma lies within the last 20
   tokens (A1111's ``comma_padding_backtrack``, default 20), the tokens after that comma move to
   the next chunk, so a phrase is not cut in two. A ``BREAK`` piece closes the chunk at once.
3. Closing a chunk pads it to 75 with the end token (weight 1.0) and wraps it in start/end:
   ``[start, t1..t75, end]``, weights ``[1.0, w1..w75, 1.0]``. After the first end token the ids
   become the tokenizer's pad token (SD 1.x pads with the end token itself; SD 2.x/SDXL's
   OpenCLIP with "!", A1111's ``id_pad``), the same layout diffusers' tokenizer gives.
4. The last chunk is closed if it has tokens, or if there is no chunk yet (an empty prompt is one
   chunk of padding).

Worked example (chunk length 4 and backtrack 2 to keep it short; A1111 uses 75 and 20):
tokens ``a b , c d e`` (weights 1) -> at ``d`` the chunk ``a b , c`` is full, the comma is 2
back, so ``c`` moves on: chunks ``[S a b , E E]`` and ``[S c d e E E]`` (S start, E end/pad).

Encoding (``encode_chunks``): each chunk's ids go through the text encoder (any callable
``ids [1, 77] -> hidden [1, 77, dim]``), the weights are applied with A1111's "Original" emphasis
(``prompt_weights.apply_emphasis``, per chunk), and the chunks are concatenated on axis 1. The
pooled output (SDXL) is the first chunk's, as in A1111. ``truncate=True`` is diffusers' behaviour
instead: one chunk of the first 75 tokens, no comma backtrack, the rest dropped (weights still
apply).

Classifier-free guidance batches the prompt with the negative prompt only at the same length.
When their chunk counts differ A1111 by default runs the two through the UNet separately; its
``pad_cond_uncond`` option instead pads the shorter with the empty prompt's chunk, which
``pad_chunks`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.pipelines.text.prompt_weights import BREAK, apply_emphasis, parse_prompt_attention

CHUNK_LENGTH = 75
COMMA_BACKTRACK = 20


@dataclass
class PromptChunk:
    """One text-encoder window: ``tokens`` and ``weights`` of length chunk_length + 2."""

    tokens: list[int] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SpecialTokens:
    """The tokenizer's ids: ``start``/``end`` around a chunk, ``pad`` after the end token, and
    ``comma`` (the id of ``,</w>``; None disables A1111's comma backtracking)."""

    start: int
    end: int
    pad: int
    comma: int | None = None


class _Chunker:
    """A1111's ``tokenize_line`` state machine (see the module docstring)."""

    def __init__(self, ids: SpecialTokens, chunk_length: int, backtrack: int) -> None:
        self.ids, self.length, self.backtrack = ids, chunk_length, backtrack
        self.chunks: list[PromptChunk] = []
        self.current = PromptChunk()
        self.last_comma = -1

    def close(self) -> None:
        chunk, missing = self.current, self.length - len(self.current.tokens)
        tokens = [self.ids.start, *chunk.tokens, *([self.ids.end] * missing), self.ids.end]
        first_end = tokens.index(self.ids.end)  # SD 2.x/SDXL: pad ids after the end token
        tokens[first_end + 1 :] = [self.ids.pad] * (len(tokens) - first_end - 1)
        self.chunks.append(PromptChunk(tokens, [1.0, *chunk.weights, *([1.0] * missing), 1.0]))
        self.current, self.last_comma = PromptChunk(), -1

    def add(self, token: int, weight: float) -> None:
        chunk = self.current
        if token == self.ids.comma:
            self.last_comma = len(chunk.tokens)
        elif (
            self.backtrack
            and len(chunk.tokens) == self.length
            and self.last_comma != -1
            and len(chunk.tokens) - self.last_comma <= self.backtrack
        ):
            cut = self.last_comma + 1
            moved = PromptChunk(chunk.tokens[cut:], chunk.weights[cut:])
            chunk.tokens, chunk.weights = chunk.tokens[:cut], chunk.weights[:cut]
            self.close()
            self.current = moved
        if len(self.current.tokens) == self.length:
            self.close()
        self.current.tokens.append(token)
        self.current.weights.append(weight)


def prompt_chunks(
    prompt: str,
    tokenize: Callable[[str], Sequence[int]],
    ids: SpecialTokens,
    *,
    truncate: bool = False,
    chunk_length: int = CHUNK_LENGTH,
    comma_backtrack: int = COMMA_BACKTRACK,
) -> list[PromptChunk]:
    """The prompt's windows, A1111's way (or diffusers' with ``truncate``). ``tokenize`` maps text
    to token ids without start/end tokens (``ClipTokenizer.tokens``)."""
    if chunk_length < 1:
        raise InputError(f"chunk_length must be at least 1, got {chunk_length}")
    chunker = _Chunker(ids, chunk_length, 0 if truncate else comma_backtrack)
    for text, weight in parse_prompt_attention(prompt):
        if (text, weight) == BREAK:
            if truncate:
                continue  # diffusers has no BREAK; the word is dropped, as A1111's parser drops it
            chunker.close()
            continue
        for token in tokenize(text):
            if truncate and not chunker.chunks and len(chunker.current.tokens) == chunk_length:
                break
            chunker.add(int(token), weight)
    if chunker.current.tokens or not chunker.chunks:
        chunker.close()
    return chunker.chunks[:1] if truncate else chunker.chunks


def pad_chunks(chunks: list[PromptChunk], count: int, empty: PromptChunk) -> list[PromptChunk]:
    """``chunks`` lengthened to ``count`` with copies of ``empty`` (the empty prompt's chunk)."""
    return [*chunks, *[PromptChunk(list(empty.tokens), list(empty.weights)) for _ in range(count - len(chunks))]]


def encode_chunks(
    chunks: Sequence[PromptChunk],
    encode: Callable[[NDArray[np.int64]], NDArray[np.float32]],
    *,
    weighted: bool = True,
) -> NDArray[np.float32]:
    """Hidden states ``[1, len(chunks) * (chunk_length + 2), dim]``: each chunk encoded by ``encode``
    (``ids [1, n] -> [1, n, dim]``), weighted with A1111's emphasis, concatenated on axis 1."""
    if not chunks:
        raise InputError("no prompt chunk to encode")
    parts = []
    for chunk in chunks:
        hidden = np.asarray(encode(np.asarray([chunk.tokens], dtype=np.int64)), dtype=np.float32)
        if hidden.ndim != 3 or hidden.shape[:2] != (1, len(chunk.tokens)):
            raise InputError(f"the text encoder returned shape {hidden.shape} for {len(chunk.tokens)} tokens")
        if weighted and any(w != 1.0 for w in chunk.weights):
            hidden = apply_emphasis(hidden, np.asarray([chunk.weights]))
        parts.append(hidden)
    return np.concatenate(parts, axis=1)
