r"""A1111's prompt attention syntax: ``(word)``, ``[word]``, ``(word:1.2)``, escapes and ``BREAK``.

``parse_prompt_attention`` splits a prompt into ``(text, weight)`` pieces exactly as
stable-diffusion-webui's ``modules/prompt_parser.parse_prompt_attention`` does:

1. Scan the prompt with one regular expression whose alternatives are, in order: the escapes
   ``\(``, ``\)``, ``\[``, ``\]``, ``\\`` and a lone ``\``; ``(``; ``[``; ``:`` + a number (optional
   whitespace around it) + ``)``; ``)``; ``]``; a run of characters that are none of
   ``\ ( ) [ ] :``; a lone ``:``.
2. For each match: an escape appends its character (``\(`` -> ``(``) with weight 1.0; ``(`` and
   ``[`` push the current piece count on the round / square stack; ``:1.3)`` with an open round
   bracket pops it and multiplies every piece since by 1.3; ``)`` pops the round stack and
   multiplies by 1.1; ``]`` pops the square stack and multiplies by 1/1.1; anything else
   (including an unmatched ``)``, ``]`` or ``:1.3)``) is text: it is split on ``BREAK`` (the
   whole word, with the whitespace around it), each part appended with weight 1.0 and a
   ``("BREAK", -1.0)`` piece between parts.
3. Brackets still open at the end multiply everything after them (by 1.1 or 1/1.1).
4. No piece at all gives ``[("", 1.0)]``; then neighbouring pieces with equal weight merge.

Weights are Python floats multiplied in that order, so ``((a))`` is 1.1 * 1.1 = 1.2100000000000002.

Worked example (A1111's own doctest)::

    a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).
    -> ("a ", 1.0), ("house", 1.3 * 1.1 * 1.1 = 1.5730000000000004), (" ", 1.1), ("on", 1.1 / 1.1 = 1.0),
       (" a ", 1.1), ("hill", 0.5 * 1.1 = 0.55), (", sun, ", 1.1), ("sky", 1.1**4 = 1.4641000000000006),
       (".", 1.1)

The first ``(`` is never closed: it multiplies everything after it by 1.1 at the end.

``apply_emphasis`` is A1111's default "Original" emphasis: the text encoder's output for a
77-token window is multiplied token by token by the weights, then rescaled so its overall mean is
what it was (``z * w * (mean(z) / mean(z * w))``).
"""

from __future__ import annotations

import re

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError

_ATTENTION = re.compile(
    r"""
    \\\(|\\\)|\\\[|\\]|\\\\|\\|
    \(|\[|
    :\s*([+-]?[.\d]+)\s*\)|
    \)|]|
    [^\\()\[\]:]+|
    :
    """,
    re.X,
)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)
ROUND_MULTIPLIER = 1.1
SQUARE_MULTIPLIER = 1 / 1.1
BREAK = ("BREAK", -1.0)
"""The piece ``parse_prompt_attention`` puts where a prompt says BREAK."""


def parse_prompt_attention(text: str) -> list[tuple[str, float]]:
    """``(text, weight)`` pieces of an A1111 prompt (see the module docstring)."""
    pieces: list[list[str | float]] = []
    round_open: list[int] = []
    square_open: list[int] = []

    def multiply_from(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            piece[1] = float(piece[1]) * factor

    for match in _ATTENTION.finditer(text):
        token, weight = match.group(0), match.group(1)
        if token.startswith("\\"):
            pieces.append([token[1:], 1.0])
        elif token == "(":
            round_open.append(len(pieces))
        elif token == "[":
            square_open.append(len(pieces))
        elif weight is not None and round_open:
            multiply_from(round_open.pop(), float(weight))
        elif token == ")" and round_open:
            multiply_from(round_open.pop(), ROUND_MULTIPLIER)
        elif token == "]" and square_open:
            multiply_from(square_open.pop(), SQUARE_MULTIPLIER)
        else:
            for i, part in enumerate(_BREAK.split(token)):
                if i > 0:
                    pieces.append(list(BREAK))
                pieces.append([part, 1.0])
    for start in round_open:
        multiply_from(start, ROUND_MULTIPLIER)
    for start in square_open:
        multiply_from(start, SQUARE_MULTIPLIER)
    if not pieces:
        pieces = [["", 1.0]]
    merged: list[list[str | float]] = [pieces[0]]
    for piece in pieces[1:]:
        if piece[1] == merged[-1][1]:
            merged[-1][0] = str(merged[-1][0]) + str(piece[0])
        else:
            merged.append(piece)
    return [(str(t), float(w)) for t, w in merged]


def apply_emphasis(hidden: NDArray[np.float32], multipliers: NDArray[np.floating]) -> NDArray[np.float32]:
    """A1111's "Original" emphasis on one window: ``hidden`` is [batch, tokens, dim] (or
    [tokens, dim]), ``multipliers`` [batch, tokens] (or [tokens]). Each token's vector is scaled
    by its weight, then the whole window by ``mean(hidden) / mean(weighted)``, as float32."""
    z = np.asarray(hidden, dtype=np.float32)
    weights = np.asarray(multipliers, dtype=np.float32)
    if weights.shape != z.shape[:-1]:
        raise InputError(f"multipliers shape {weights.shape} does not match hidden states {z.shape}")
    original_mean = z.mean(dtype=np.float32)
    weighted = z * weights[..., None]
    new_mean = weighted.mean(dtype=np.float32)
    return np.asarray(weighted * (original_mean / new_mean), dtype=np.float32)
