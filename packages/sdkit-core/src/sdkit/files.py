"""Reading users' files safely: paths that stay inside their folder, headers checked before
anything is allocated, nothing unpickled, everything opened read-only.

- ``inside(folder, path)``: ``path`` resolved (symlinks followed) must lie inside ``folder``
  (resolved too); a model folder cannot point a loader at ``/etc/passwd`` or ``~/.ssh``.
- ``read_npy(path)``: a ``.npy`` array; its header (dtype, shape) is checked against the file's
  size and the memory budget before numpy allocates, and object arrays (pickles) are refused.
- ``check_safetensors_header(path)``: a ``.safetensors`` header's declared tensors must fit the
  file and the budget, before a reader allocates or maps them.
- ``read_json_object(path)``: a JSON file holding an object (a folder's config files), or one
  ``ModelFormatError``; ``read_optional_json_object`` gives ``{}`` for an absent file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np

from sdkit.errors import InputError, ModelFormatError
from sdkit.limits import check_bytes

# The safetensors library's own limit on the JSON header.
SAFETENSORS_MAX_HEADER = 100_000_000
SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_NPY_MAX_HEADER = 10_000  # numpy's own default limit
MAX_RANK = 64  # numpy's most dimensions


def inside(folder: str | os.PathLike[str], path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` (relative to ``folder`` unless absolute) resolved through every symlink; a
    ModelFormatError when the result leaves ``folder`` (itself resolved)."""
    root = Path(folder).resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ModelFormatError(f"{what} {str(path)!r} points outside its folder {root} (refused)")
    return target


def inside_model_folder(folder: str | os.PathLike[str], path: str | os.PathLike[str], what: str = "file") -> Path:
    """``inside``, also allowing the Hugging Face cache's layout, where the files of
    ``models--org--name/snapshots/<revision>/`` are links to files in ``models--org--name/blobs/``.
    Only to those: ``blobs`` must be a real folder of the repository (a link from ``blobs`` to
    ``/`` made ``/etc/passwd`` a blob), and the target a regular file directly inside it."""
    try:
        return inside(folder, path, what)
    except ModelFormatError:
        root = Path(folder).absolute()
        snapshot = next((p for p in (root, *root.parents) if p.parent.name == "snapshots"), None)
        target = (root / path).resolve()
        if snapshot is not None:
            blobs = snapshot.parent.parent.resolve() / "blobs"
            if not blobs.is_symlink() and blobs.is_dir() and target.parent == blobs and target.is_file():
                return target
        raise


def _npy_header(file: Any) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    from numpy.lib import format as npy

    version = npy.read_magic(file)
    if version == (1, 0):
        header: tuple[tuple[int, ...], bool, np.dtype[Any]] = npy.read_array_header_1_0(
            file, max_header_size=_NPY_MAX_HEADER
        )
    else:
        header = npy.read_array_header_2_0(file, max_header_size=_NPY_MAX_HEADER)
    return header


def read_npy(path: str | os.PathLike[str]) -> np.ndarray:
    """A ``.npy`` array, never unpickled; its declared size is checked before reading."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"input file not found: {path}")
    try:
        with file.open("rb") as f:
            shape, _, dtype = _npy_header(f)
            data_bytes = os.fstat(f.fileno()).st_size - f.tell()
            if dtype.hasobject:
                raise InputError(f"{path} holds Python objects (a pickle): refused, only numeric arrays are read")
            declared = math.prod(int(d) for d in shape) * dtype.itemsize
            check_bytes(declared, f"{path} ({dtype}{list(shape)})")
            if declared > data_bytes:
                raise InputError(f"{path} is truncated: its header declares {declared} bytes, it holds {data_bytes}")
            f.seek(0)
            array: np.ndarray = np.load(f, allow_pickle=False)
            return array
    # numpy parses the header with ast.literal_eval: a mangled one raises any of these
    except (ValueError, OSError, EOFError, SyntaxError, TypeError, TokenError, RecursionError, OverflowError) as exc:
        raise InputError(f"{path} is not a readable .npy array: {exc}") from None


def _safetensors_entries(path: Path) -> tuple[dict[str, Any], int]:
    """The parsed JSON header of a safetensors file and the size of its data section."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFormatError(f"{path.name} is not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if length > SAFETENSORS_MAX_HEADER or length > size - 8:
            raise ModelFormatError(f"{path.name}: its header length ({length} bytes) does not fit the file ({size})")
        raw = f.read(length)
    try:
        header = json.loads(raw, object_pairs_hook=unique_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ModelFormatError(f"{path.name}: its header is not JSON: {_short(exc)}") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path.name}: its header is not a JSON object")
    return header, size - 8 - length


def _entry_bytes(path: Path, name: str, entry: Any, data_size: int) -> int:
    if not isinstance(entry, dict):
        raise ModelFormatError(f"{path.name}: tensor {name!r} has no description")
    shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    ints = (list, tuple)
    if not isinstance(shape, ints) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ModelFormatError(f"{path.name}: tensor {name!r} has an invalid shape {shape!r}")
    if any(d < 0 for d in shape):
        raise ModelFormatError(f"{path.name}: tensor {name!r} has a negative dimension {shape}")
    ok_offsets = isinstance(offsets, ints) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
    begin, end = (int(offsets[0]), int(offsets[1])) if ok_offsets and offsets is not None else (-1, -1)
    if not 0 <= begin <= end <= data_size:
        raise ModelFormatError(f"{path.name}: tensor {name!r} lies outside the file ({offsets!r}, {data_size} bytes)")
    itemsize = SAFETENSORS_ITEMSIZE.get(str(dtype))
    problem = shape_problem(shape, itemsize or 1)
    if problem:
        raise ModelFormatError(f"{path.name}: tensor {name!r} {problem}")
    declared = math.prod(shape) * itemsize if itemsize is not None else end - begin
    if declared != end - begin:
        raise ModelFormatError(
            f"{path.name}: tensor {name!r} is {dtype}{list(shape)} ({declared} bytes) but its data holds {end - begin}"
        )
    return declared


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` refusing a key given twice (JSON keeps the last,
    silently: a safetensors header naming one tensor twice would describe two tensors as one)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice")
            seen.add(key)
    return found


def shape_problem(shape: list[int] | tuple[int, ...], itemsize: int) -> str | None:
    """Why no array can have ``shape`` (too many dims, or dims whose product, zeros left out,
    passes 2**63 bytes: ``[0, 2**70]`` holds no byte but breaks every reader later), else None."""
    if len(shape) > MAX_RANK:
        return f"has {len(shape)} dimensions, more than {MAX_RANK}"
    if math.prod(max(int(d), 1) for d in shape) * itemsize >= 1 << 63:
        return f"has a shape no array can take ({list(shape)}: its nonzero dimensions multiply past 2**63 bytes)"
    return None


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def check_safetensors_header(path: str | os.PathLike[str], *, budget: bool = True) -> dict[str, Any]:
    """The header of a ``.safetensors`` file, checked: every tensor's bytes match its dtype and
    shape and lie inside the file, and (``budget``) together they fit the memory budget.
    Returns the header (name -> {dtype, shape, data_offsets}, and ``__metadata__``)."""
    path = Path(path)
    try:
        header, data_size = _safetensors_entries(path)
    except OSError as exc:
        raise ModelFormatError(f"{path.name} cannot be read: {exc}") from None
    total = sum(_entry_bytes(path, n, e, data_size) for n, e in header.items() if n != "__metadata__")
    if budget:
        check_bytes(total, f"{path.name} (the tensors its header declares)")
    return header


def read_json_object(path: Path, what: str = "file") -> dict[str, Any]:
    """A JSON file holding an object, or one ModelFormatError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ModelFormatError(f"{what} {path} cannot be read: {_short(exc)}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{what} {path} does not hold a JSON object")
    return data


def read_optional_json_object(path: Path, what: str = "config") -> dict[str, Any]:
    """``read_json_object``, or an empty dict when the file is absent."""
    return read_json_object(path, what) if path.is_file() else {}
