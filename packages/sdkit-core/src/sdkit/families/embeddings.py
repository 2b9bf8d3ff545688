"""Textual-inversion embeddings (A1111 ``.safetensors`` files): new token vectors for the text
encoders, triggered by the file's name in the prompt.

File layouts (``fixtures/families/README.md``, "Textual inversion"): ``emb_params`` ``[n, D]``
(A1111's safetensors), ``string_to_param.*`` (an A1111 ``.pt`` dict flattened), one tensor under
any key (diffusers' ``{token: tensor}``), and SDXL's ``clip_l`` / ``clip_g`` pair for its two
text encoders. The vectors of a text encoder go to the encoder whose token table is that wide.

How they are used is diffusers' ``load_textual_inversion``, whose token ids and outputs the
tests compare with: an ``n``-vector embedding ``name`` adds the tokens ``name``, ``name_1``, ...
``name_{n-1}`` to the tokenizer, with ids ``len(tokenizer) + k`` in load order, and its vectors
as those rows of ``token_embedding`` (the table grows when the ids pass its end, as with the
real 49,408-token vocabulary); ``name`` in a prompt stands for all ``n`` tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdkit.errors import ModelFormatError
from sdkit.families.checkpoint import Checkpoint
from sdkit.families.family import Family, initializer_specs

TOKEN_TABLE = "text_model.embeddings.token_embedding.weight"
SDXL_KEYS = {"clip_l": "text_encoder", "clip_g": "text_encoder_2"}


@dataclass(frozen=True)
class Embedding:
    """A textual-inversion embedding: its trigger word and its vectors per text encoder
    (float32 ``[n, width]``, the same ``n`` for every encoder)."""

    name: str
    vectors: dict[str, np.ndarray]
    path: Path

    @property
    def count(self) -> int:
        return int(next(iter(self.vectors.values())).shape[0])


def text_encoder_widths(family: Family) -> dict[str, int]:
    """Text-encoder component -> width of its token table."""
    widths = {}
    for component, spec in family.components.items():
        shape = initializer_specs(spec.load_graph()).get(TOKEN_TABLE, ((), None))[0]
        if len(shape) == 2:
            widths[component] = int(shape[1])
    return widths


def _matrices(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    name = checkpoint.path.name
    floats = [k for k in checkpoint if checkpoint.entry(k).dtype in ("F16", "F32", "BF16", "F64")]
    if not floats:
        raise ModelFormatError(f"{name} holds no float tensors: not a textual-inversion embedding")
    if set(floats) & set(SDXL_KEYS):
        keys = [k for k in floats if k in SDXL_KEYS]
    elif "emb_params" in floats:
        keys = ["emb_params"]
    elif len(floats) == 1:
        keys = floats
    else:
        shown = ", ".join(floats[:5])
        raise ModelFormatError(
            f"{name} is not a textual-inversion embedding: expected emb_params, string_to_param.*, "
            f"clip_l/clip_g or a single tensor, found {len(floats)} tensors ({shown})"
        )
    matrices = {}
    for key in keys:
        entry = checkpoint.entry(key)
        if len(entry.shape) not in (1, 2) or not entry.size:
            raise ModelFormatError(f"{name}: {key} has shape {list(entry.shape)}, not [vectors, width]")
        matrices[key] = checkpoint.files[0].read(entry, np.float32).reshape(-1, entry.shape[-1])
    return matrices


def open_embedding(path: str | os.PathLike[str], family: Family, name: str | None = None) -> Embedding:
    """Read an embedding file for ``family``'s text encoders; its trigger is ``name`` or the
    file's stem (A1111). One ``ModelFormatError`` when it does not fit the family."""
    checkpoint = Checkpoint.open(path)
    try:
        matrices = _matrices(checkpoint)
    finally:
        checkpoint.close()
    widths = text_encoder_widths(family)
    file = checkpoint.path.name
    vectors: dict[str, np.ndarray] = {}
    for key, matrix in matrices.items():
        wanted = [SDXL_KEYS[key]] if key in SDXL_KEYS else [c for c, w in widths.items() if w == matrix.shape[1]]
        for component in wanted:
            if widths.get(component) == matrix.shape[1]:
                vectors[component] = matrix
    missing = [c for c in widths if c not in vectors]
    if missing:
        have = ", ".join(f"{k} width {m.shape[1]}" for k, m in matrices.items())
        need = ", ".join(f"{c} width {w}" for c, w in widths.items())
        raise ModelFormatError(f"{file} is an embedding for another model: it has {have}; {family.label} needs {need}")
    counts = {m.shape[0] for m in vectors.values()}
    if len(counts) != 1:
        raise ModelFormatError(f"{file}: its text encoders' vector counts differ ({sorted(counts)})")
    trigger = (name or checkpoint.path.stem).strip()
    if not trigger or any(c.isspace() for c in trigger):
        raise ModelFormatError(f"{file}: the trigger word {trigger!r} must be one word without spaces")
    return Embedding(trigger, vectors, checkpoint.path)


def embedding_rows(table: np.ndarray, rows: dict[int, np.ndarray], size: int = 0) -> np.ndarray:
    """A fresh token table: ``table`` with ``rows`` (id -> vector) written, grown with zero rows
    to ``size`` rows or when an id is past its end."""
    size = max(table.shape[0], max(rows, default=-1) + 1, size)
    grown = np.zeros((size, table.shape[1]), dtype=table.dtype)
    grown[: table.shape[0]] = table
    for index, vector in rows.items():
        grown[index] = vector
    return grown
