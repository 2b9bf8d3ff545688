"""The second half of the bad-input matrix (issue 30's second pass): hostile files and requests
for what this round added. Upscaler files run on each backend; GGUF headers, checkpoint merges,
face-restoration files (damaged GFPGAN/CodeFormer/RetinaFace files: each a ModelFormatError)
and ``sdkit serve``'s endpoints once (no backend compiles them: the server runs the tiny SD 1.5
pipeline on the reference backend). Each case does what a user would do and must end as an
``SdkitError`` (a CLI: exit 1 and one ``sdkit: error:`` line), or for the server as a 4xx with a
JSON ``detail``; anything else (a traceback, a 5xx, exit 0) is a failure.

Used by ``tools/bad_inputs.py``; nothing here is imported by the library or its tests.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
UPSCALERS = REPO / "fixtures" / "upscalers"
SD15 = REPO / "fixtures" / "tiny_xl" / "sd15"
NETS = REPO / "fixtures" / "tiny_xl" / "controlnet"
SD1 = REPO / "fixtures" / "families" / "tiny" / "sd1"
SDXL = REPO / "fixtures" / "families" / "tiny" / "sdxl"


def _safetensors(path: Path, entries: list[tuple[str, list[int]]], data: bytes | None = None) -> Path:
    """A safetensors file with ``entries`` (F32) and zero-filled data (``data``: the data
    section instead, e.g. too short)."""
    offset, header = 0, {}
    for key, shape in entries:
        size = int(np.prod(shape, dtype=object)) * 4
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        if data is None:
            f.truncate(8 + len(text) + offset)
        else:
            f.write(data)
    return path


# -- upscaler files ------------------------------------------------------------------------------


def _tiny_entries(case: str = "compact_x2") -> list[tuple[str, list[int]]]:
    goldens = json.loads((UPSCALERS / "goldens.json").read_text())["cases"]
    return [(k, list(s)) for k, s in goldens[case]["entries"]]


def engine(backend: str) -> tuple[str, dict[str, Any]]:
    """A matrix column -> (sdkit backend, its options): ``ggml-vulkan`` is ggml on ``vulkan:0``."""
    if backend == "ggml-vulkan":
        return "ggml", {"device": "vulkan:0"}
    return backend, {"threads": 1} if backend == "ggml" else {}


def _upscale(path: Path, backend: str) -> None:
    from sdkit.pipelines.stages.upscaler import ModelUpscaler

    backend, options = engine(backend)
    up = ModelUpscaler(path, backend=backend, graphs=[UPSCALERS / "tiny"], tile=0, **options)
    up.upscale_array(np.zeros((1, 8, 8, 3), np.float32))


def _up_file(
    edit: Callable[[list[tuple[str, list[int]]]], list[tuple[str, list[int]]]], data: bytes | None = None
) -> Callable[[str, Path], None]:
    """``data``: the data section (a huge declared shape's file holds only this)."""

    def case(backend: str, folder: Path) -> None:
        _upscale(_safetensors(folder / "up.safetensors", edit(_tiny_entries()), data), backend)

    return case


def _up_pickle(backend: str, folder: Path) -> None:
    path = folder / "RealESRGAN_x4plus.pth"
    path.write_bytes(pickle.dumps({"params_ema": {"conv_first.weight": [0.0]}}))
    _upscale(path, backend)


def _up_pickle_renamed(backend: str, folder: Path) -> None:
    path = folder / "renamed.safetensors"
    path.write_bytes(pickle.dumps({"conv_first.weight": [0.0]}))
    _upscale(path, backend)


def _up_short(backend: str, folder: Path) -> None:
    _upscale(_safetensors(folder / "short.safetensors", _tiny_entries(), data=b"\0" * 64), backend)


def _up_by_name(name: str) -> Callable[[str, Path], None]:
    def case(backend: str, folder: Path) -> None:
        import os

        import sdkit

        os.environ["SDKIT_UPSCALER_DIR"] = str(folder)
        (folder / "in.png").write_bytes(_png(8, 8))
        backend, options = engine(backend)
        sdkit.upscale(folder / "in.png", name, backend=backend, device=options.get("device"))

    return case


def _reshape(index: int, shape: list[int]) -> Callable[[list[Any]], list[Any]]:
    return lambda entries: [(k, shape if i == index else s) for i, (k, s) in enumerate(entries)]


UPSCALER_CASES: list[tuple[str, Callable[[str, Path], None]]] = [
    ("control: the valid file runs", _up_file(lambda e: e)),
    ("first conv of the wrong shape", _up_file(_reshape(0, [8, 3, 5, 5]))),
    ("a body conv with other channels", _up_file(_reshape(2, [7, 8, 3, 3]))),
    ("a key missing", _up_file(lambda e: e[:-1])),
    ("an extra unknown key", _up_file(lambda e: [*e, ("rogue.weight", [1])])),
    ("declared 2^16 x 2^16 x 3 x 3 (sparse 154 GB)", _up_file(_reshape(0, [2**16, 2**16, 3, 3]))),
    ("declared 2^20 x 2^20 x 3 x 3", _up_file(_reshape(0, [2**20, 2**20, 3, 3]), b"\0" * 4096)),
    ("declared 2^62 channels", _up_file(_reshape(0, [2**62, 3, 3, 3]), b"\0" * 4096)),
    ("data shorter than the header", _up_short),
    (".pth pickle (never unpickled)", _up_pickle),
    ("a pickle named .safetensors", _up_pickle_renamed),
    ("model name '../../etc/passwd'", _up_by_name("../../etc/passwd")),
    ("model name '/etc/passwd'", _up_by_name("/etc/passwd")),
]


def _swinir_file(
    edit: Callable[[list[tuple[str, list[int]]]], list[tuple[str, list[int]]]], data: bytes | None = None
) -> Callable[[str, Path], None]:
    """A tiny SwinIR header (``swinir_goldens.json``'s pixelshuffle x2 case), edited, zero-filled:
    every such file is refused."""

    def case(backend: str, folder: Path) -> None:
        goldens = json.loads((UPSCALERS / "swinir_goldens.json").read_text())["cases"]
        entries = [(k, list(s)) for k, s in goldens["swinir_ps_x2"]["entries"]]
        _upscale(_safetensors(folder / "swinir.safetensors", edit(entries), data), backend)

    return case


def _swinir_shape(suffix: str, shape: list[int]) -> Callable[[list[Any]], list[Any]]:
    return lambda entries: [(k, shape if k.endswith(suffix) else s) for k, s in entries]


UPSCALER_CASES += [
    ("SwinIR: zero-filled F32 throughout (the index buffer is not int64)", _swinir_file(lambda e: e)),
    ("SwinIR: window 0", _swinir_file(_swinir_shape("blocks.0.attn.relative_position_index", [0, 0]))),
    ("SwinIR: embed dim 0", _swinir_file(_swinir_shape("conv_first.weight", [0, 3, 3, 3]))),
    (
        "SwinIR: a bias table of 2^40 rows",
        _swinir_file(_swinir_shape("blocks.1.attn.relative_position_bias_table", [2**40, 2]), b"\0" * 4096),
    ),
    ("SwinIR: attn_mask of 2^40 windows", _swinir_file(_swinir_shape("attn_mask", [2**40, 16, 16]), b"\0" * 4096)),
    (
        "SwinIR: pixel-unshuffled input (conv_first.1)",
        _swinir_file(lambda e: [("conv_first.1.weight" if k == "conv_first.weight" else k, s) for k, s in e]),
    ),
]


# -- GGUF headers --------------------------------------------------------------------------------


def _gstr(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _gguf(
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    kv: bytes | None = None,
    dims: tuple[int, ...] = (4, 320),
    kind: int = 1,
    offset: int = 0,
    data: bytes | None = None,
    n_dims: int | None = None,
) -> bytes:
    """A GGUF v3 file: one string metadata entry, one tensor of ``dims`` (innermost first) and
    ``kind``, its data zero-filled unless ``data`` says."""
    kv = kv if kv is not None else _gstr("general.name") + struct.pack("<I", 8) + _gstr("tiny")
    name = "model.diffusion_model.input_blocks.0.0.weight"
    tensor = (
        _gstr(name)
        + struct.pack("<I", len(dims) if n_dims is None else n_dims)
        + b"".join(struct.pack("<Q", d) for d in dims)
    )
    tensor += struct.pack("<II", kind, 0)[:4] + struct.pack("<Q", offset)
    head = magic + struct.pack("<IQQ", version, 1 if n_tensors is None else n_tensors, 1 if n_kv is None else n_kv)
    body = head + kv + tensor
    body += b"\0" * (-len(body) % 32)
    return body + (data if data is not None else b"\0" * (int(np.prod(dims)) * 2))


def _nested_arrays(depth: int) -> bytes:
    """A metadata value that is an array of one array of one array ... ``depth`` deep."""
    return _gstr("deep") + struct.pack("<I", 9) + (struct.pack("<IQ", 9, 1) * depth) + struct.pack("<IQ", 4, 0)


def _inspect(data: bytes | Callable[[], bytes]) -> Callable[[str, Path], None]:
    def case(backend: str, folder: Path) -> None:
        path = folder / "model.gguf"
        path.write_bytes(data() if callable(data) else data)
        _cli(["inspect", str(path)])

    return case


def _gguf_load(backend: str, folder: Path) -> None:
    import sdkit

    path = folder / "model.gguf"
    path.write_bytes(_gguf())
    sdkit.load_pipeline(path, backend=backend)


def _truncated() -> bytes:
    whole = _gguf()
    return whole[: len(whole) // 2 - 300]


GGUF_CASES: list[tuple[str, Callable[[str, Path], None]]] = [
    ("control: a whole file", _inspect(_gguf())),
    ("bad magic", _inspect(_gguf(magic=b"GGUX"))),
    ("version 1", _inspect(_gguf(version=1))),
    ("version 2^32-1", _inspect(_gguf(version=2**32 - 1))),
    ("header cut short", _inspect(lambda: _gguf()[:40])),
    ("data cut short", _inspect(_gguf(data=b"\0" * 100))),
    ("2^63 tensors", _inspect(_gguf(n_tensors=2**63))),
    ("2^63 metadata entries", _inspect(_gguf(n_kv=2**63))),
    ("string length 2^62", _inspect(_gguf(kv=_gstr("general.name", 2**62)))),
    ("string length past the end", _inspect(_gguf(kv=_gstr("k") + struct.pack("<I", 8) + _gstr(b"ab", 10**6)))),
    ("unknown metadata type 99", _inspect(_gguf(kv=_gstr("k") + struct.pack("<I", 99)))),
    ("array of 2^60 items", _inspect(_gguf(kv=_gstr("k") + struct.pack("<IIQ", 9, 0, 2**60)))),
    ("arrays nested 100000 deep", _inspect(lambda: _gguf(kv=_nested_arrays(100_000)))),
    ("n_dims 2^31", _inspect(_gguf(n_dims=2**31))),
    ("dims 2^31 x 2^31, no data", _inspect(_gguf(dims=(2**31,) * 2, data=b""))),
    ("dims 2^63 x 2^63", _inspect(_gguf(dims=(2**63, 2**63), data=b""))),
    ("unknown tensor type 999", _inspect(_gguf(kind=999))),
    ("data offset 2^63", _inspect(_gguf(offset=2**63))),
    ("load_pipeline without sd.cpp", _gguf_load),
]


# -- checkpoint merges ---------------------------------------------------------------------------


_SCRATCH: list[Path] = []  # the running case's folder (merges write there, never beside a fixture)


def _merge(a: Path, b: Path | None, c: Path | None = None, output: Path | None = None, **kw: Any) -> None:
    from sdkit.families.merge import merge_checkpoints

    mode = "add-difference" if c is not None else "weighted-sum"
    merge_checkpoints(a, b, c, output=output or _SCRATCH[-1] / "merged.safetensors", mode=mode, **kw)


def _sd1() -> Path:
    return SD1 / "sd1_fp16.safetensors"


def _with_one_shape_changed(folder: Path) -> Path:
    from sdkit.families.safetensors_reader import SafetensorsFile

    f = SafetensorsFile(_sd1())
    entries = [(k, list(e.shape)) for k, e in f.entries.items()]
    f.close()
    key = next(k for k, s in entries if len(s) == 4)
    return _safetensors(folder / "b.safetensors", [(k, [*s[:-1], s[-1] + 1] if k == key else s) for k, s in entries])


def _missing_keys(folder: Path) -> Path:
    from sdkit.families.safetensors_reader import SafetensorsFile

    f = SafetensorsFile(_sd1())
    entries = [(k, list(e.shape)) for k, e in f.entries.items()]
    f.close()
    return _safetensors(folder / "c.safetensors", entries[: len(entries) // 2])


def _pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"state_dict": {}}))
    return path


def _sdxl() -> Path:
    return next(p for p in sorted(SDXL.glob("*.safetensors")))


def _merge_output(output: str) -> Callable[[str, Path], None]:
    def case(backend: str, folder: Path) -> None:
        import shutil

        a = Path(shutil.copy(_sd1(), folder / "a.safetensors"))
        b = Path(shutil.copy(_sd1(), folder / "b.safetensors"))
        target = {"A": a, "B": b}.get(output, folder / output)
        _merge(a, b, output=target)

    return case


def _in(folder: Path, run: Callable[[], None]) -> None:
    _SCRATCH.append(folder)
    run()


MERGE_CASES: list[tuple[str, Callable[[str, Path], None]]] = [
    ("control: A + B, valid", lambda b, f: _in(f, lambda: _merge(_sd1(), _sd1()))),
    ("B with a tensor of another shape", lambda b, f: _merge(_sd1(), _with_one_shape_changed(f))),
    ("A SD 1.x, B SDXL", lambda b, f: _merge(_sd1(), _sdxl())),
    ("C missing half the keys", lambda b, f: _in(f, lambda: _merge(_sd1(), _sd1(), _missing_keys(f)))),
    ("B a pickle", lambda b, f: _merge(_sd1(), _pickle(f / "b.ckpt"))),
    ("B missing", lambda b, f: _merge(_sd1(), f / "nope.safetensors")),
    ("B a folder", lambda b, f: _merge(_sd1(), f)),
    ("output over A", _merge_output("A")),
    ("output over B", _merge_output("B")),
    ("output in a missing folder", _merge_output("no/such/dir/out.safetensors")),
    ("alpha NaN", lambda b, f: _in(f, lambda: _merge(_sd1(), _sd1(), alpha=float("nan")))),
    ("dtype int8", lambda b, f: _in(f, lambda: _merge(_sd1(), _sd1(), dtype="int8"))),
]


# -- sdkit serve ---------------------------------------------------------------------------------


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bomb() -> str:
    """A PNG declaring 100000 x 100000 pixels (its IHDR only: the decoder must refuse it unread)."""
    import zlib

    raw = bytearray(_png(8, 8))
    struct.pack_into(">II", raw, 16, 100_000, 100_000)
    struct.pack_into(">I", raw, 29, zlib.crc32(bytes(raw[12:29])))
    return _b64(bytes(raw))


_GOOD = _b64(_png(64, 64))
_TXT = {"prompt": "a cat", "steps": 2, "width": 64, "height": 64, "sampler_name": "Euler"}


def _unit(**kw: Any) -> dict[str, Any]:
    unit = {"enabled": True, "image": _GOOD, "module": "none", "model": "sd15_a"} | kw
    return {"alwayson_scripts": {"controlnet": {"args": [unit]}}}


# (name, method, path, JSON body)
SERVER_CASES: list[tuple[str, str, str, Any]] = [
    (
        "control: a valid Lanczos upscale",
        "post",
        "/sdapi/v1/extra-single-image",
        {"image": _GOOD, "upscaler_1": "Lanczos"},
    ),
    ("control: txt2img with a ControlNet unit", "post", "/sdapi/v1/txt2img", _TXT | _unit()),
    ("extra-single-image: base64 garbage", "post", "/sdapi/v1/extra-single-image", {"image": "@@not base64@@"}),
    ("extra-single-image: a text file", "post", "/sdapi/v1/extra-single-image", {"image": _b64(b"hello")}),
    ("extra-single-image: 100000^2 PNG", "post", "/sdapi/v1/extra-single-image", {"image": _bomb()}),
    (
        "extra-single-image: resize 1e9",
        "post",
        "/sdapi/v1/extra-single-image",
        {"image": _GOOD, "upscaling_resize": 1e9},
    ),
    (
        "extra-single-image: to 10^9 x 10^9",
        "post",
        "/sdapi/v1/extra-single-image",
        {"image": _GOOD, "resize_mode": 1, "upscaling_resize_w": 10**9, "upscaling_resize_h": 10**9},
    ),
    (
        "extra-single-image: upscaler '../x'",
        "post",
        "/sdapi/v1/extra-single-image",
        {"image": _GOOD, "upscaler_1": "../x"},
    ),
    (
        "extra-batch-images: one bad image",
        "post",
        "/sdapi/v1/extra-batch-images",
        {"imageList": [{"data": _GOOD, "name": "a"}, {"data": "AAAA", "name": "b"}]},
    ),
    ("png-info: a JPEG-less text", "post", "/sdapi/v1/png-info", {"image": _b64(b"GIF89a not really")}),
    ("png-info: base64 garbage", "post", "/sdapi/v1/png-info", {"image": "%%%"}),
    ("options: checkpoint '../x'", "post", "/sdapi/v1/options", {"sd_model_checkpoint": "../x"}),
    ("options: checkpoint '/etc/passwd'", "post", "/sdapi/v1/options", {"sd_model_checkpoint": "/etc/passwd"}),
    ("options: sd_vae '../../vae'", "post", "/sdapi/v1/options", {"sd_vae": "../../vae.safetensors"}),
    ("options: checkpoint a number", "post", "/sdapi/v1/options", {"sd_model_checkpoint": 7}),
    ("internal/progress: id_task a list", "post", "/internal/progress", {"id_task": [1]}),
    (
        "controlnet/detect: bad image",
        "post",
        "/controlnet/detect",
        {"controlnet_module": "canny", "controlnet_input_images": ["x"]},
    ),
    (
        "controlnet/detect: unknown module",
        "post",
        "/controlnet/detect",
        {"controlnet_module": "../../x", "controlnet_input_images": [_GOOD]},
    ),
    ("txt2img: ControlNet model '../../x'", "post", "/sdapi/v1/txt2img", _TXT | _unit(model="../../x")),
    ("txt2img: ControlNet model '/etc'", "post", "/sdapi/v1/txt2img", _TXT | _unit(model="/etc/passwd")),
    ("txt2img: ControlNet image garbage", "post", "/sdapi/v1/txt2img", _TXT | _unit(image="!!")),
    ("txt2img: ControlNet image 100000^2", "post", "/sdapi/v1/txt2img", _TXT | _unit(image=_bomb())),
    ("txt2img: ControlNet weight NaN-ish", "post", "/sdapi/v1/txt2img", _TXT | _unit(weight="nan")),
    ("txt2img: hr_scale 1e6", "post", "/sdapi/v1/txt2img", _TXT | {"enable_hr": True, "hr_scale": 1e6}),
    ("txt2img: hr_upscaler unknown", "post", "/sdapi/v1/txt2img", _TXT | {"enable_hr": True, "hr_upscaler": "Nope"}),
    ("txt2img: hr_upscaler '../x'", "post", "/sdapi/v1/txt2img", _TXT | {"enable_hr": True, "hr_upscaler": "../x"}),
    ("txt2img: LoRA tag '../../x'", "post", "/sdapi/v1/txt2img", _TXT | {"prompt": "a <lora:../../x:1>"}),
    (
        "img2img: mask of another size",
        "post",
        "/sdapi/v1/img2img",
        _TXT | {"init_images": [_GOOD], "mask": _b64(_png(32, 48))},
    ),
    ("img2img: mask garbage", "post", "/sdapi/v1/img2img", _TXT | {"init_images": [_GOOD], "mask": "zz"}),
    ("img2img: init image a text", "post", "/sdapi/v1/img2img", _TXT | {"init_images": [_b64(b"text")]}),
    ("options: a damaged --ckpt-dir file", "post", "/sdapi/v1/options", {"sd_model_checkpoint": "broken"}),
    ("options: a cut GGUF in --ckpt-dir (unlisted)", "post", "/sdapi/v1/options", {"sd_model_checkpoint": "cut"}),
    ("options: a damaged --vae-dir file", "post", "/sdapi/v1/options", {"sd_vae": "bad.safetensors"}),
    ("control: still serving after all that", "post", "/sdapi/v1/txt2img", _TXT),
]


@contextlib.contextmanager
def serve_client(folder: Path) -> Any:
    """``create_app`` on the tiny SD 1.5 pipeline (reference backend), ControlNets from the
    tiny fixtures, a ``--ckpt-dir`` and ``--vae-dir`` holding one file each; 5xx not raised."""
    import os

    from fastapi.testclient import TestClient

    from sdkit_serve.app import create_app
    from sdkit_serve.config import ServerConfig
    from sdkit_serve.engine import Engine

    os.environ["SDKIT_ISOLATE"] = "0"
    os.environ["SDKIT_UPSCALER_DIR"] = str(folder)
    import shutil

    for sub in ("ckpt", "vae", "cn", "lora"):
        (folder / sub).mkdir(exist_ok=True)
    (folder / "ckpt" / "broken.safetensors").write_bytes(struct.pack("<Q", 40) + b"{not json" * 8)
    (folder / "ckpt" / "cut.gguf").write_bytes(_gguf()[:200])
    (folder / "vae" / "bad.safetensors").write_bytes(b"\xff" * 64)
    if not (folder / "cn" / "sd15_a").exists():
        shutil.copytree(NETS / "sd15_a", folder / "cn" / "sd15_a")
    config = ServerConfig(
        models=(SD15,),
        backend="reference",
        ckpt_dir=folder / "ckpt",
        vae_dir=folder / "vae",
        controlnet_dir=folder / "cn",
        lora_dir=folder / "lora",
    )
    engine = Engine(config)
    try:
        with TestClient(create_app(engine), base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            yield client
    finally:
        engine.close()


def judge_reply(name: str, status: int, text: str) -> str:
    """``clear 4xx`` for a 4xx with a JSON ``detail``, ``control ran`` for a control's 200, else
    what it was."""
    if name.startswith("control:"):
        return "control ran" if status == 200 else f"control failed: HTTP {status}: {text[:160]}"
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    if 400 <= status < 500 and isinstance(detail, str) and detail:
        return "clear 4xx"
    return f"HTTP {status}: {text[:160]}"


def _cli(argv: list[str]) -> None:
    """Run the sdkit CLI in-process: exit 1 with one ``sdkit: error:`` line is raised as the
    SdkitError it printed; exit 0 returns (the caller reports it)."""
    from sdkit.cli.main import main
    from sdkit.errors import SdkitError

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code == 1 and len(lines) == 1 and lines[0].startswith("sdkit: error:"):
        raise SdkitError(lines[0])
    if code != 0:
        raise RuntimeError(f"exit {code}: {err.getvalue()[-200:]!r}")


# -- face-restoration files ----------------------------------------------------------------------

FACES_E2E = REPO / "fixtures" / "faces" / "e2e"


def _face_files(folder: Path) -> dict[str, Path]:
    """The end-to-end test's four files (tiny GFPGAN/CodeFormer, crafted RetinaFace, ParseNet) in
    ``folder``, the tiny graphs found as shipped ones."""
    import importlib.util

    import sdkit.families.codeformer
    import sdkit.families.gfpgan

    spec = importlib.util.spec_from_file_location("e2e_weights", FACES_E2E / "e2e_weights.py")
    if spec is None or spec.loader is None:
        raise ImportError("fixtures/faces/e2e/e2e_weights.py")
    weights = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)
    (folder / "graphs").mkdir()
    graphs = weights.graph_folder(folder / "graphs", sdkit.families.gfpgan.graphs_dir())
    sdkit.families.gfpgan.graphs_dir = lambda: graphs  # type: ignore[assignment]
    sdkit.families.codeformer.graphs_dir = lambda: graphs  # type: ignore[assignment]
    files: dict[str, Path] = weights.write_files(folder)
    return files


def _face_case(
    which: str, damage: Callable[[Path], Path] | None = None, restorer: str = "gfpgan"
) -> Callable[[str, Path], None]:
    """``sdkit.restore_faces`` on the e2e photo with ``which`` file damaged (square mask: the
    reference backend runs no 512 px parser in the control)."""

    def case(backend: str, folder: Path) -> None:
        import sdkit
        from sdkit.pipelines.stages import faces

        faces._LOADED.clear()
        files = _face_files(folder)
        if damage is not None:
            files[which] = damage(files[which])
        sdkit.restore_faces(
            FACES_E2E / "photo.png", files[restorer], detector=files["detector"], use_parse=False, backend=backend
        )

    return case


def _edit(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Path], Path]:
    def damage(path: Path) -> Path:
        from safetensors.numpy import load_file, save_file

        save_file(change(dict(load_file(str(path)))), str(path))
        return path

    return damage


def _first_conv_reshaped(tensors: dict[str, Any]) -> dict[str, Any]:
    key = next(k for k, v in tensors.items() if v.ndim == 4)
    tensors[key] = np.zeros((tensors[key].shape[0] + 1, *tensors[key].shape[1:]), np.float32)
    return tensors


def _one_key_dropped(tensors: dict[str, Any]) -> dict[str, Any]:
    tensors.pop(next(k for k, v in tensors.items() if v.ndim == 4))
    return tensors


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _pickled(suffix: str) -> Callable[[Path], Path]:
    def damage(path: Path) -> Path:
        out = path.with_suffix(suffix) if suffix else path
        out.write_bytes(pickle.dumps({"params_ema": {"conv_body_first.weight": [0.0]}}))
        return out

    return damage


def _huge(path: Path) -> Path:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        entries = [(k, list(f.get_slice(k).get_shape())) for k in f.keys()]  # noqa: SIM118
    first = next(i for i, (_, shape) in enumerate(entries) if len(shape) == 4)
    entries[first] = (entries[first][0], [2**20, 2**20, 3, 3])
    return _safetensors(path, entries, b"\0" * 4096)


FACE_CASES: list[tuple[str, Callable[[str, Path], None]]] = [
    ("control: the valid files run", _face_case("gfpgan")),
    ("GFPGAN: a conv of another shape", _face_case("gfpgan", _edit(_first_conv_reshaped))),
    ("CodeFormer: a key missing", _face_case("codeformer", _edit(_one_key_dropped), "codeformer")),
    ("GFPGAN: data shorter than the header", _face_case("gfpgan", _truncate)),
    ("CodeFormer: declared 2^20 x 2^20 x 3 x 3", _face_case("codeformer", _huge, "codeformer")),
    ("GFPGANv1.4.pth pickle (never unpickled)", _face_case("gfpgan", _pickled(".pth"))),
    ("a pickle named .safetensors (restorer)", _face_case("gfpgan", _pickled(""))),
    ("RetinaFace: data shorter than the header", _face_case("detector", _truncate)),
    ("RetinaFace: a conv of another shape", _face_case("detector", _edit(_first_conv_reshaped))),
    ("RetinaFace: a key missing", _face_case("detector", _edit(_one_key_dropped))),
    ("a GFPGAN file given as the detector", _face_case("detector", lambda p: p.with_name("GFPGANv1.4.safetensors"))),
]


# valid inputs that must run: the controls (each class's harness reaches the code under test)
# and a documented result (A1111's rule: a key C lacks counts as zero)
ACCEPTED = {"C missing half the keys"}

# class -> (per backend?, cases)
FILE_CASES: dict[str, tuple[bool, list[tuple[str, Callable[[str, Path], None]]]]] = {
    "upscaler files (sdkit.upscale)": (True, UPSCALER_CASES),
    "GGUF headers (sdkit inspect)": (False, GGUF_CASES),
    "checkpoint merges (sdkit merge)": (False, MERGE_CASES),
    "face-restoration files (sdkit.restore_faces)": (False, FACE_CASES),
}
SERVER_CLASS = "sdkit serve requests (new endpoints)"
