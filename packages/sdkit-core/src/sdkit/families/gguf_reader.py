"""A GGUF file's header, read with the standard library: its metadata, its tensors (name, shape,
ggml type), the model family their names say and the quantization they carry. No ggml or
stable-diffusion.cpp needed: ``sdkit inspect`` and sdkit-sdcpp's loader use it.

Layout (GGUF v2/v3, little-endian): ``b"GGUF"``, version u32, tensor count u64, metadata count u64,
the metadata (key string, value type u32, value), then per tensor: name string, n_dims u32, dims
u64 each (innermost first), ggml type u32, data offset u64. A string is a u64 length and UTF-8
bytes. The counts and lengths are bounded before anything is allocated: a truncated or hostile
header is a ``ModelFormatError``, never a huge allocation.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from sdkit.errors import ModelFormatError

MAGIC = b"GGUF"
MAX_TENSORS = 1_000_000
MAX_METADATA = 100_000
MAX_STRING = 1 << 24  # 16 MiB: a tokenizer's merges list as one string would be long, never this
MAX_ARRAY = 1 << 24
MAX_DIMS = 8
MAX_NESTING = 8  # arrays of arrays: no real file nests; each level is a Python frame
# ggml_type -> name (ggml.h; the ones GGUF files for image models use, and the rest of the enum).
GGML_TYPES: dict[int, str] = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
    10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 16: "iq2_xxs",
    17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs",
    24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64", 29: "iq1_m", 30: "bf16", 34: "tq1_0",
    35: "tq2_0", 39: "mxfp4",
}  # fmt: skip
# ggml type -> (values per block, bytes per block) (ggml's type traits), for the data's sizes.
BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "f64": (1, 8), "i8": (1, 1), "i16": (1, 2),
    "i32": (1, 4), "i64": (1, 8), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22),
    "q5_1": (32, 24), "q8_0": (32, 34), "q8_1": (32, 36), "q2_K": (256, 84), "q3_K": (256, 110),
    "q4_K": (256, 144), "q5_K": (256, 176), "q6_K": (256, 210), "q8_K": (256, 292),
}  # fmt: skip
# Metadata value types: struct format of the scalars; 8 string, 9 array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # outermost first, as numpy and safetensors write it
    type: str
    offset: int = 0  # of its data, from the start of the data section

    @property
    def nbytes(self) -> int | None:
        """Its data's size in bytes (None for a type without a known block layout)."""
        block = BLOCKS.get(self.type)
        if block is None:
            return None
        count, size = block
        return math.prod(self.shape) // count * size


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: tuple[GgufTensor, ...] = ()
    data_start: int = 0  # where the tensor data begins (the header's end, aligned)

    def check_complete(self) -> None:
        """A ``ModelFormatError`` when the file is shorter than its tensors' data (a truncated
        download): caught here, before a native loader reads past the end."""
        sizes = [(t.offset + n, t.name) for t in self.tensors if (n := t.nbytes) is not None]
        if not sizes:
            return
        end, name = max(sizes)
        have = self.path.stat().st_size
        if self.data_start + end > have:
            raise ModelFormatError(
                f"{self.path.name} is truncated: its tensors end at byte {self.data_start + end:,} ({name}), "
                f"the file has {have:,}"
            )

    def type_counts(self) -> Counter[str]:
        """ggml type -> how many tensors have it."""
        return Counter(t.type for t in self.tensors)

    @property
    def quantization(self) -> str:
        """The type most matrix parameters (in tensors of 2-D and up, counted by element) have:
        ``q8_0``, ``q4_K``, ``f16``..., or ``"none"`` for a file without any. Norms and biases stay
        f32 in every quantized file, and so do the small convolutions whose rows a quantized
        block does not divide."""
        weights: Counter[str] = Counter()
        for tensor in self.tensors:
            if len(tensor.shape) >= 2:
                weights[tensor.type] += math.prod(tensor.shape)
        return weights.most_common(1)[0][0] if weights else "none"

    @property
    def family(self) -> str:
        return family_of({t.name: t.shape for t in self.tensors})


class _Reader:
    def __init__(self, stream: BinaryIO, path: Path) -> None:
        self.stream, self.path = stream, path

    def take(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise ModelFormatError(f"{self.path.name}: the GGUF header is truncated")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, limit: int, what: str) -> int:
        value = int(self.scalar("<Q"))
        if value > limit:
            raise ModelFormatError(f"{self.path.name}: the GGUF header claims {value} {what} (more than {limit})")
        return value

    def string(self) -> str:
        return self.take(self.count(MAX_STRING, "bytes in a string")).decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= MAX_NESTING:
                raise ModelFormatError(f"{self.path.name}: GGUF metadata arrays nested over {MAX_NESTING} deep")
            item = int(self.scalar("<I"))
            return [self.value(item, depth + 1) for _ in range(self.count(MAX_ARRAY, "array items"))]
        raise ModelFormatError(f"{self.path.name}: unknown GGUF metadata type {kind}")


def read_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at ``path`` (a ``ModelFormatError`` if it is not one)."""
    path = Path(path)
    try:
        with path.open("rb") as stream:
            return _read(_Reader(stream, path))
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read(reader: _Reader) -> GgufHeader:
    if reader.stream.read(4) != MAGIC:
        raise ModelFormatError(f"{reader.path.name} is not a GGUF file (no GGUF magic)")
    version = int(reader.scalar("<I"))
    if version not in (2, 3):
        raise ModelFormatError(f"{reader.path.name}: GGUF version {version} (versions 2 and 3 are read)")
    n_tensors = reader.count(MAX_TENSORS, "tensors")
    n_metadata = reader.count(MAX_METADATA, "metadata entries")
    metadata = {}
    for _ in range(n_metadata):
        key = reader.string()
        metadata[key] = reader.value(int(reader.scalar("<I")))
    tensors = []
    for _ in range(n_tensors):
        name = reader.string()
        n_dims = int(reader.scalar("<I"))
        if n_dims > MAX_DIMS:
            raise ModelFormatError(f"{reader.path.name}: tensor {name!r} has {n_dims} dimensions")
        dims = [int(reader.scalar("<Q")) for _ in range(n_dims)]
        kind = int(reader.scalar("<I"))
        if kind not in GGML_TYPES:  # as ggml's own reader: a type it has no layout for is refused
            raise ModelFormatError(f"{reader.path.name}: tensor {name!r} has an unknown ggml type {kind}")
        offset = int(reader.scalar("<Q"))
        tensors.append(GgufTensor(name, tuple(reversed(dims)), GGML_TYPES[kind], offset))
    alignment = metadata.get("general.alignment", 32)
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    data_start = -(-reader.stream.tell() // alignment) * alignment
    return GgufHeader(reader.path, version, metadata, tuple(tensors), data_start)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    try:
        with path.open("rb") as stream:
            return stream.read(4) == MAGIC
    except OSError:
        return False


def _strip(name: str) -> str:
    for prefix in ("model.diffusion_model.", "diffusion_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def family_of(shapes: dict[str, tuple[int, ...]]) -> str:
    """The model family the tensor names (and a few shapes) say, in stable-diffusion.cpp's terms:
    SD 1.x, SD 2.x, SDXL, SD3, FLUX.1 (Fill), Chroma, FLUX.2, Qwen-Image, Z-Image, Wan (2.1/2.2, T2V/I2V/TI2V), or
    "unknown". Read from the denoiser's keys, with or without the ``model.diffusion_model.``
    prefix a full checkpoint has."""
    names = {_strip(n): s for n, s in shapes.items()}

    def has(part: str) -> bool:
        return any(part in name for name in names)

    if has("double_blocks.") and has("single_blocks."):
        if has("distilled_guidance_layer."):
            return "Chroma"
        if has("double_stream_modulation"):
            return "FLUX.2"
        img_in = names.get("img_in.weight", ())
        return "FLUX.1 Fill" if len(img_in) == 2 and img_in[1] == 384 else "FLUX.1"
    if has("joint_blocks."):
        return "SD3"
    if has("transformer_blocks.") and has("img_mod."):
        return "Qwen-Image"
    if has("noise_refiner.") or has("context_refiner."):
        return "Z-Image"
    if has("patch_embedding.") and has("blocks.") and has("self_attn."):
        return _wan_family(names, has("img_emb."), has("vace_blocks."))
    if has("input_blocks."):
        return _unet_family(names)
    return "unknown"


def _wan_family(names: dict[str, tuple[int, ...]], image_embedding: bool, vace: bool) -> str:
    """Wan's version and task from its patch embedding (``[dim, in_channels, 1, 2, 2]``), as
    stable-diffusion.cpp tells them apart (the width from a block's query): 48 input channels is
    Wan2.2 TI2V 5B; 36 (the image's
    latents and mask beside the noise) with a CLIP image embedding is Wan2.1 I2V/FLF2V, without
    one Wan2.2 I2V (one expert of it); 16 is text-to-video, the same layout in 2.1 and 2.2."""
    patch = names.get("patch_embedding.weight", ())
    query = names.get("blocks.0.self_attn.q.weight", ())
    dim = query[0] if query else (patch[0] if patch else 0)
    # kernel 1x2x2; a GGUF file holds the 5-d Conv3d weight as 4-d (its dims merged), so count
    channels = math.prod(patch) // 4 // dim if patch and dim else 0
    size = {1536: " 1.3B", 3072: " 5B", 5120: " 14B"}.get(dim, "")
    if channels == 48:
        return f"Wan2.2 TI2V{size}"
    if channels == 36:
        return f"Wan2.1 I2V{size}" if image_embedding else f"Wan2.2 I2V{size}"
    return f"Wan2.1 VACE{size}" if vace else f"Wan2.x T2V{size}"


def _unet_family(names: dict[str, tuple[int, ...]]) -> str:
    first = names.get("input_blocks.0.0.weight", ())
    inpaint = " inpainting" if len(first) == 4 and first[1] == 9 else ""
    if any(n.startswith("label_emb.") for n in names):
        return "SDXL" + inpaint
    context = next((s for n, s in names.items() if n.endswith("attn2.to_k.weight") and len(s) == 2), ())
    if context and context[1] == 1024:
        return "SD 2.x" + inpaint
    return "SD 1.x" + inpaint
