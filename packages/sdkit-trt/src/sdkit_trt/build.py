"""Building a weight-stripped, refittable plan with the TensorRT(-RTX) builder.

Only called with a GPU and the vendor module present (unverified in CI: see the README).
The builder config: STRIP_PLAN + REFIT (not REFIT_IDENTICAL: users bring other weights),
a strongly typed network (the graph's fp16/fp32 types are the precision; TensorRT-RTX and
TensorRT 11 have no fp16 flag), TF32 off for fp32 (it is on by default), TensorRT-RTX
targets the current GPU (ComputeCapability CURRENT) instead of its default list, and the
TensorRT timing cache is read and written when the flavour has one.

fp8 adds no builder flag: its graph carries FLOAT8E4M3FN weights behind DequantizeLinear
(``sdkit_trt.fp8``), and TensorRT's explicit-quantization guide says Q/DQ networks are built
strongly typed with no precision-control flags (no ``BuilderFlag.FP8``). What fp8 needs of the
module is ``DataType.FP8`` and ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from sdkit.errors import OptionError, SdkitError, UnsupportedModelError, UnsupportedNode
from sdkit_trt.onnx_source import OnnxSource
from sdkit_trt.shapes import Profiles
from sdkit_trt.store import read_bytes, write_atomic

BACKEND = "tensorrt"


def make_logger(trt: ModuleType) -> Any:
    """An ILogger that keeps error messages (for our exceptions) and drops the chatter."""

    class Logger(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(msg)

    return Logger()


def parser_problems(parser: Any) -> list[UnsupportedNode | str]:
    """The ONNX parser's errors as UnsupportedNode entries (node name, op, reason)."""
    problems: list[UnsupportedNode | str] = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        desc = str(error.desc())
        node_name = getattr(error, "node_name", None)
        op = getattr(error, "node_operator", None)
        if callable(node_name) and callable(op) and op():
            problems.append(UnsupportedNode(str(node_name()), str(op()), "", 0, desc))
        else:
            problems.append(desc)
    return problems or ["the ONNX parser failed without saying why"]


def parse_into(trt: ModuleType, network: Any, logger: Any, source: OnnxSource) -> Any:
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(source.path) if source.path else parser.parse(source.data)
    if not ok:
        raise UnsupportedModelError(BACKEND, parser_problems(parser))
    return parser


def fp8_problem(trt: ModuleType, label: str) -> str:
    """Why this TensorRT(-RTX) module cannot build the fp8 graph, or "" when it can."""
    if getattr(getattr(trt, "DataType", None), "FP8", None) is None:
        return f"{label} has no FP8 data type (tensorrt.DataType.FP8)"
    if getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None) is None:
        return f"{label} cannot build strongly typed networks, which FP8 Q/DQ graphs need"
    return ""


def network_flags(trt: ModuleType) -> int:
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 1 << int(flag) if flag is not None else 0


def configure(trt: ModuleType, builder: Any, network: Any, *, is_rtx: bool, profiles: Profiles, precision: str) -> Any:
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.STRIP_PLAN)
    config.set_flag(trt.BuilderFlag.REFIT)
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if precision == "fp32" and tf32 is not None:
        config.clear_flag(tf32)  # TF32 (10-bit mantissa) is on by default; fp32 means fp32
    if is_rtx:
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.CURRENT, 0)
    if profiles:
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            name = network.get_input(i).name
            if name in profiles:
                p = profiles[name]
                profile.set_shape(name, p.min, p.opt, p.max)
        config.add_optimization_profile(profile)
    return config


def build_plan(
    trt: ModuleType, source: OnnxSource, *, is_rtx: bool, profiles: Profiles, timing_cache: Path | None, precision: str
) -> bytes:
    """Parse ``source`` and build a serialized plan (bytes) for the current CUDA device."""
    if precision == "fp8" and not network_flags(trt):
        raise OptionError("precision 'fp8' needs a strongly typed network, which this TensorRT cannot build")
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt))
    parse_into(trt, network, logger, source)
    config = configure(trt, builder, network, is_rtx=is_rtx, profiles=profiles, precision=precision)
    cache = None
    if timing_cache is not None and hasattr(config, "create_timing_cache"):
        cache = config.create_timing_cache(read_bytes(timing_cache) or b"")
        config.set_timing_cache(cache, False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SdkitError(
            "TensorRT could not build an engine: " + ("; ".join(logger.errors[-5:]) or "no error reported")
        )
    if cache is not None and timing_cache is not None:
        write_atomic(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(memoryview(plan))
