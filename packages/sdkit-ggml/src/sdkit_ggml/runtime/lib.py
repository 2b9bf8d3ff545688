"""ctypes bindings to the ggml shared libraries (libggml-python's build or the user's own).

The libraries are loaded with RTLD_GLOBAL in dependency order (base, cpu and other backend
libraries, then ggml), and every function used gets explicit ``argtypes`` and ``restype``:
a pointer left to ctypes' default ``c_int`` would be truncated to 32 bits. Enum values and
struct layouts below are those of ggml 0.20.x; the version is checked when the library loads.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdkit.errors import BackendUnavailableError

# The ggml releases whose headers these bindings were checked against (ggml_version()).
SUPPORTED_GGML = ((0, 20),)
INSTALL_HINT = "pip install 'libggml-python>=0.20.2,<0.21' (or set SDKIT_GGML_LIB_DIR to your ggml build)"

# enum ggml_type
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8
GGML_TYPE_I32 = 26
# enum ggml_op_pool
GGML_OP_POOL_MAX = 0
GGML_OP_POOL_AVG = 1
# enum ggml_scale_mode / ggml_scale_flag
GGML_SCALE_MODE_NEAREST = 0
GGML_SCALE_MODE_BILINEAR = 1
GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
# enum ggml_backend_dev_type
DEV_TYPE_CPU, DEV_TYPE_GPU, DEV_TYPE_IGPU, DEV_TYPE_ACCEL = 0, 1, 2, 3
GGML_STATUS_SUCCESS = 0
# enum ggml_prec
GGML_PREC_F32 = 10


class InitParams(ctypes.Structure):
    """struct ggml_init_params, passed by value to ggml_init."""

    _fields_ = (("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool))


class TensorHead(ctypes.Structure):
    """The leading fields of struct ggml_tensor (type, buffer, ne[4], nb[4])."""

    _fields_ = (
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    )


GGML_MAX_N_THREADS = 512


class ThreadpoolParams(ctypes.Structure):
    """struct ggml_threadpool_params (filled by ggml_threadpool_params_init)."""

    _fields_ = (
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    )


_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
_L = ctypes.c_int64
_S = ctypes.c_size_t
_B = ctypes.c_bool
_C = ctypes.c_char_p
# ggml_backend_sched_eval_callback: bool (*)(struct ggml_tensor * t, bool ask, void * user_data)
EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)

# name -> (restype, argtypes). ctx and tensors are opaque pointers.
_SIGNATURES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "ggml_version": (_C, ()),
    "ggml_init": (_P, (InitParams,)),
    "ggml_free": (None, (_P,)),
    "ggml_tensor_overhead": (_S, ()),
    "ggml_get_mem_size": (_S, (_P,)),
    "ggml_used_mem": (_S, (_P,)),
    "ggml_graph_overhead_custom": (_S, (_S, _B)),
    "ggml_new_tensor_4d": (_P, (_P, _I, _L, _L, _L, _L)),
    "ggml_set_name": (_P, (_P, _C)),
    "ggml_set_input": (None, (_P,)),
    "ggml_set_output": (None, (_P,)),
    "ggml_nbytes": (_S, (_P,)),
    # weight quantization (precision="q8_0"): ggml's own quantizer, so the blocks are exactly
    # what its kernels expect
    "ggml_quantize_chunk": (_S, (_I, _P, _P, _L, _L, _L, _P)),
    "ggml_row_size": (_S, (_I, _L)),
    "ggml_blck_size": (_L, (_I,)),
    "ggml_new_graph_custom": (_P, (_P, _S, _B)),
    "ggml_build_forward_expand": (None, (_P, _P)),
    "ggml_graph_n_nodes": (_I, (_P,)),
    "ggml_graph_node": (_P, (_P, _I)),
    # binary
    "ggml_add": (_P, (_P, _P, _P)),
    "ggml_sub": (_P, (_P, _P, _P)),
    "ggml_mul": (_P, (_P, _P, _P)),
    "ggml_div": (_P, (_P, _P, _P)),
    # unary
    **{
        f"ggml_{name}": (_P, (_P, _P))
        for name in (
            "sqr",
            "sqrt",
            "log",
            "sin",
            "cos",
            "abs",
            "sgn",
            "neg",
            "step",
            "tanh",
            "elu",
            "relu",
            "sigmoid",
            "gelu",
            "gelu_erf",
            "silu",
            "hardsigmoid",
            "hardswish",
            "exp",
            "floor",
            "ceil",
            "round",
            "trunc",
            "softplus",
            "cont",
            "transpose",
            "sum_rows",
            "mean",
            "argmax",
            "soft_max",
        )
    },
    "ggml_leaky_relu": (_P, (_P, _P, _F, _B)),
    "ggml_scale": (_P, (_P, _P, _F)),
    "ggml_scale_bias": (_P, (_P, _P, _F, _F)),
    "ggml_clamp": (_P, (_P, _P, _F, _F)),
    "ggml_norm": (_P, (_P, _P, _F)),
    "ggml_soft_max_ext": (_P, (_P, _P, _P, _F, _F)),
    "ggml_mul_mat": (_P, (_P, _P, _P)),
    "ggml_mul_mat_set_prec": (None, (_P, _I)),  # (struct ggml_tensor * a, enum ggml_prec prec)
    "ggml_flash_attn_ext": (_P, (_P, _P, _P, _P, _P, _F, _F, _F)),
    "ggml_flash_attn_ext_set_prec": (None, (_P, _I)),
    "ggml_cast": (_P, (_P, _P, _I)),
    "ggml_repeat_4d": (_P, (_P, _P, _L, _L, _L, _L)),
    "ggml_concat": (_P, (_P, _P, _P, _I)),
    "ggml_reshape_4d": (_P, (_P, _P, _L, _L, _L, _L)),
    "ggml_view_4d": (_P, (_P, _P, _L, _L, _L, _L, _S, _S, _S, _S)),
    "ggml_permute": (_P, (_P, _P, _I, _I, _I, _I)),
    "ggml_get_rows": (_P, (_P, _P, _P)),
    "ggml_set_inplace": (_P, (_P, _P, _P, _S, _S, _S, _S)),
    "ggml_im2col": (_P, (_P, _P, _P, _I, _I, _I, _I, _I, _I, _B, _I)),
    "ggml_conv_transpose_2d_p0": (_P, (_P, _P, _P, _I)),
    "ggml_pool_1d": (_P, (_P, _P, _I, _I, _I, _I)),
    "ggml_pool_2d": (_P, (_P, _P, _I, _I, _I, _I, _I, _F, _F)),
    "ggml_interpolate": (_P, (_P, _P, _L, _L, _L, _L, ctypes.c_uint32)),
    "ggml_pad_ext": (_P, (_P, _P, _I, _I, _I, _I, _I, _I, _I, _I)),
    # allocation and backends
    "ggml_backend_alloc_ctx_tensors": (_P, (_P, _P)),
    "ggml_backend_buffer_free": (None, (_P,)),
    "ggml_backend_buffer_get_size": (_S, (_P,)),
    "ggml_backend_tensor_set": (None, (_P, _P, _S, _S)),
    "ggml_backend_tensor_get": (None, (_P, _P, _S, _S)),
    "ggml_backend_graph_compute": (_I, (_P, _P)),
    "ggml_backend_supports_op": (_B, (_P, _P)),
    "ggml_backend_synchronize": (None, (_P,)),
    "ggml_backend_free": (None, (_P,)),
    "ggml_backend_name": (_C, (_P,)),
    "ggml_backend_get_default_buffer_type": (_P, (_P,)),
    "ggml_backend_dev_count": (_S, ()),
    "ggml_backend_dev_get": (_P, (_S,)),
    "ggml_backend_dev_name": (_C, (_P,)),
    "ggml_backend_dev_description": (_C, (_P,)),
    "ggml_backend_dev_type": (_I, (_P,)),
    "ggml_backend_dev_init": (_P, (_P, _C)),
    "ggml_backend_dev_supports_op": (_B, (_P, _P)),
    "ggml_backend_load_all_from_path": (None, (_C,)),
    "ggml_gallocr_new": (_P, (_P,)),
    "ggml_gallocr_free": (None, (_P,)),
    "ggml_gallocr_alloc_graph": (_B, (_P, _P)),
    "ggml_gallocr_get_buffer_size": (_S, (_P, _I)),
    # introspection and per-node timing (runtime/profile.py, runtime/buildinfo.py)
    "ggml_op_desc": (_C, (_P,)),
    "ggml_get_name": (_C, (_P,)),
    "ggml_backend_sched_new": (_P, (_P, _P, _I, _S, _B, _B)),
    "ggml_backend_sched_free": (None, (_P,)),
    "ggml_backend_sched_set_eval_callback": (None, (_P, EVAL_CALLBACK, _P)),
    "ggml_backend_sched_graph_compute": (_I, (_P, _P)),
    "ggml_backend_dev_backend_reg": (_P, (_P,)),
    "ggml_backend_reg_get_proc_address": (_P, (_P, _C)),
}
# From libggml-cpu (absent in GPU-only builds).
_CPU_SIGNATURES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "ggml_backend_is_cpu": (_B, (_P,)),
    "ggml_backend_cpu_set_n_threads": (None, (_P, _I)),
}
# Bound when the library has them (``GgmlLib.has``): lowerings that have another way.
_OPTIONAL_SIGNATURES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # GGML_OP_CONV_2D: im2col tile by tile into the work buffer, then mul_mat in the kernel's type
    "ggml_conv_2d_direct": (_P, (_P, _P, _P, _I, _I, _I, _I, _I, _I)),
    # GGML_OP_CONV_2D_DW: depthwise (groups == channels, one kernel per channel), F32 sums;
    # (ctx, kernel [KW,KH,1,C], data [W,H,C,N], stride0, stride1, pad0, pad1, dilation0, dilation1)
    "ggml_conv_2d_dw_direct": (_P, (_P, _P, _P, _I, _I, _I, _I, _I, _I)),
    # persistent CPU thread pools (runtime/threads.py)
    "ggml_threadpool_params_init": (None, (_P, _I)),
    "ggml_threadpool_new": (_P, (_P,)),
    "ggml_backend_cpu_set_threadpool": (None, (_P, _P)),
}


@dataclass
class GgmlLib:
    """The loaded libraries: call functions as attributes, e.g. ``lib.ggml_add(ctx, a, b)``."""

    directory: Path
    version: str
    handles: list[ctypes.CDLL]
    has_cpu: bool
    functions: dict[str, Any]

    def has(self, name: str) -> bool:
        """Whether ``name`` is bound (the optional functions may be absent)."""
        return name in self.functions

    def __getattr__(self, name: str) -> Any:
        # Only functions bound with argtypes/restype are reachable: an unbound ctypes
        # function would silently truncate pointers.
        try:
            return self.__dict__["functions"][name]
        except KeyError:
            raise AttributeError(name) from None


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("libggml")  # locate only; its __init__ binds nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for sub in ("lib64", "lib"):
        if (root / sub / "libggml.so").exists() or (root / sub / "libggml.dylib").exists():
            return root / sub
    return None


def library_dir() -> Path | None:
    """Where the ggml libraries are: $SDKIT_GGML_LIB_DIR, else the build made for this machine
    (``native.native_dir``), else an installed prebuilt GPU build (``native.prebuilt_dir``: the
    ``sdkit-ggml-vulkan`` wheel), else the libggml-python package."""
    override = os.environ.get("SDKIT_GGML_LIB_DIR")
    if override:
        return Path(override)
    from sdkit_ggml.runtime.native import native_dir, prebuilt_dir

    return native_dir() or prebuilt_dir() or _package_dir()


def _shared_name(directory: Path, stem: str) -> Path:
    for suffix in (".so", ".dylib", ".dll"):
        if (directory / f"{stem}{suffix}").exists():
            return directory / f"{stem}{suffix}"
    return directory / f"{stem}.so"


def _find(handles: list[ctypes.CDLL], name: str) -> Any:
    for handle in reversed(handles):
        try:
            return getattr(handle, name)
        except AttributeError:
            continue
    return None


def _check_version(version: str) -> None:
    parts = version.split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        raise BackendUnavailableError("ggml", f"cannot parse ggml version {version!r}", INSTALL_HINT) from None
    if major_minor not in SUPPORTED_GGML:
        tested = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_GGML)
        raise BackendUnavailableError(
            "ggml", f"ggml {version} is not a tested release (tested: {tested})", INSTALL_HINT
        )


def _load(directory: Path) -> GgmlLib:
    mode = ctypes.RTLD_GLOBAL
    base = _shared_name(directory, "libggml-base")
    main = _shared_name(directory, "libggml")
    if not main.exists():
        raise BackendUnavailableError("ggml", f"no libggml shared library in {directory}", INSTALL_HINT)
    handles: list[ctypes.CDLL] = []
    try:
        if base.exists():
            handles.append(ctypes.CDLL(str(base), mode=mode))
        # Backend libraries (cpu, cuda, vulkan, metal...) before libggml, which links them.
        backend_libs = sorted(p for p in directory.glob("libggml-*.so") if p.name != base.name)
        cpu_handle: ctypes.CDLL | None = None
        for path in backend_libs:
            handle = ctypes.CDLL(str(path), mode=mode)
            handles.append(handle)
            if path.name.startswith("libggml-cpu"):
                cpu_handle = handle
        handles.append(ctypes.CDLL(str(main), mode=mode))
    except OSError as exc:
        raise BackendUnavailableError(
            "ggml", f"cannot load the ggml libraries from {directory}: {exc}", INSTALL_HINT
        ) from None
    version_fn = _find(handles, "ggml_version")
    if version_fn is None:
        raise BackendUnavailableError("ggml", f"{directory} has no ggml_version symbol", INSTALL_HINT)
    version_fn.restype, version_fn.argtypes = ctypes.c_char_p, []
    version = (version_fn() or b"?").decode()
    _check_version(version)
    functions: dict[str, Any] = {}
    tables = [_SIGNATURES, _CPU_SIGNATURES] if cpu_handle is not None else [_SIGNATURES]
    for table in tables:
        for name, (restype, argtypes) in table.items():
            fn = _find(handles, name)
            if fn is None:
                raise BackendUnavailableError("ggml", f"ggml {version} lacks {name}", INSTALL_HINT)
            fn.restype = restype
            fn.argtypes = list(argtypes)
            functions[name] = fn
    for name, (restype, argtypes) in _OPTIONAL_SIGNATURES.items():
        fn = _find(handles, name)
        if fn is not None:
            fn.restype, fn.argtypes = restype, list(argtypes)
            functions[name] = fn
    lib = GgmlLib(directory, version, handles, has_cpu=cpu_handle is not None, functions=functions)
    # Backends built as loadable modules (GGML_BACKEND_DL) register only when loaded.
    if directory != _package_dir():
        lib.ggml_backend_load_all_from_path(str(directory).encode())
    return lib


_lock = threading.Lock()
_loaded: GgmlLib | None = None


def load_library() -> GgmlLib:
    """Load (once) and return the ggml libraries; BackendUnavailableError when impossible."""
    global _loaded
    with _lock:
        if _loaded is None:
            directory = library_dir()
            if directory is None:
                raise BackendUnavailableError("ggml", "libggml-python is not installed", INSTALL_HINT)
            _loaded = _load_or_fall_back(directory)
        return _loaded


def _load_or_fall_back(directory: Path) -> GgmlLib:
    """Load ``directory``; a machine build that does not load gives way to the wheel's build."""
    packaged = _package_dir()
    try:
        return _load(directory)
    except BackendUnavailableError as exc:
        if os.environ.get("SDKIT_GGML_LIB_DIR") or packaged is None or directory == packaged:
            raise
        warnings.warn(f"the ggml build in {directory} does not load ({exc.reason}); using libggml-python's",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return _load(packaged)


def tensor_head(ptr: int) -> TensorHead:
    """The type, ne and nb of a ggml tensor."""
    return TensorHead.from_address(ptr)
