"""The ``tensorrt`` backend: TensorRT-RTX (preferred) or TensorRT 10/11 on NVIDIA GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, CompiledModel, SupportReport
from sdkit.device import Device
from sdkit.errors import BackendUnavailableError, DeviceError, OptionError, UnsupportedNode
from sdkit.known_backends import install_command
from sdkit_trt.build import fp8_problem
from sdkit_trt.driver import Gpu, probe_driver
from sdkit_trt.runtime import (
    BACKEND_NAME,
    INSTALL_HINT,
    RuntimeInfo,
    cuda_bindings_available,
    find_runtimes,
    import_runtime,
    rtx_unsupported,
    runtime_for,
    sms_from_module,
)
from sdkit_trt.shapes import parse_profiles

if TYPE_CHECKING:
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options

TENSORRT_HINT = (
    f"TensorRT 10/11 for this GPU ({install_command('tensorrt', 'sdkit-trt')}), or backend 'ggml' on cuda:N "
    "(python -m sdkit_ggml.runtime.native_build --cuda)"
)
DRIVER_HINT = "install the NVIDIA driver (r580 or newer for CUDA 13 builds of TensorRT-RTX)"
# Operators the ONNX-TensorRT support matrix lists as unsupported (docs/operators.md of
# onnx/onnx-tensorrt). A pre-flight only: the parser, at compile time, has the last word.
UNSUPPORTED_OPS = frozenset(
    {
        "BitShift", "Bernoulli", "BlackmanWindow", "Compress", "ConcatFromSequence", "ConvInteger", "DFT", "Det",
        "DynamicQuantizeLinear", "HammingWindow", "HannWindow", "MatMulInteger", "MaxRoiPool", "MaxUnpool",
        "MelWeightMatrix", "Multinomial", "NegativeLogLikelihoodLoss", "Optional", "OptionalGetElement",
        "OptionalHasElement", "QLinearConv", "QLinearMatMul", "STFT", "SequenceAt", "SequenceConstruct",
        "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap",
        "SoftmaxCrossEntropyLoss", "SplitToSequence", "StringNormalizer", "TfIdfVectorizer", "Unique",
    }
)  # fmt: skip
FP8_MIN_CC = (8, 9)  # FP8 tensor cores: Ada, Hopper and newer
UNSUPPORTED_TYPES = {"float64": "TensorRT has no float64", "object": "TensorRT has no strings or sequences"}


class TensorRTBackend(Backend):
    name: ClassVar[str] = BACKEND_NAME
    priority: ClassVar[int] = 90  # the fastest runtime on NVIDIA GPUs
    refittable: ClassVar[bool] = True
    extra_options: ClassVar[Mapping[str, type | tuple[type, ...]]] = {"profiles": dict}
    description: ClassVar[str] = "NVIDIA TensorRT-RTX / TensorRT (CUDA GPUs)"
    # What backend="auto" may pick TensorRT for. fp8 is compiled when asked for by name
    # (backend="tensorrt", precision="fp8") but not declared: it depends on the GPU (compute
    # capability 8.9+) and TensorRT build, which this class-level list cannot say, and a declared
    # fp8 would make auto pick TensorRT on an Ampere GPU only for its compile to refuse.
    precisions: ClassVar[tuple[str, ...] | None] = ("fp32", "fp16")

    def __init__(self) -> None:
        self._assignment: dict[int, tuple[Gpu, RuntimeInfo]] | None = None
        self._availability: Availability | None = None

    def probe(self) -> Availability:
        """Runtime module, cuda-bindings, driver, GPUs: every missing piece is named at once."""
        runtimes, notes = find_runtimes()
        problems: list[str] = []
        hint = ""
        problems.extend(notes)
        report = probe_driver()
        if not runtimes:
            if not notes:
                problems.append("neither tensorrt_rtx (TensorRT-RTX) nor tensorrt 10/11 is installed")
            rtx_refuses = rtx_unsupported(report.gpus)
            if rtx_refuses:  # the [nvidia] extra would not help: say so, by GPU and compute capability
                problems.append(rtx_refuses)
            hint = TENSORRT_HINT if rtx_refuses else INSTALL_HINT
        if not cuda_bindings_available():
            problems.append("cuda-bindings is not installed")
            hint = INSTALL_HINT
        if report.error:
            problems.append(report.error)
            hint = hint or DRIVER_HINT
        elif not report.gpus:
            problems.append("the NVIDIA driver lists no GPU")
        assignment: dict[int, tuple[Gpu, RuntimeInfo]] = {}
        refused: list[str] = []
        for gpu in report.gpus:
            runtime, why = runtime_for(gpu, runtimes)
            if runtime is None:
                refused.append(f"cuda:{gpu.ordinal} {gpu.describe()}: {why or 'no TensorRT installed'}")
            else:
                assignment[gpu.ordinal] = (gpu, runtime)
        if report.gpus and not assignment and runtimes:
            problems.append("unsupported GPU: " + "; ".join(refused))
        if problems:
            self._availability = Availability(False, "; ".join(problems), hint)
            return self._availability
        for runtime in {r.module: r for _, r in assignment.values()}.values():
            import_runtime(runtime)  # a broken install shows here, not at the first compile
        self._assignment = assignment
        labels = sorted({r.label for _, r in assignment.values()})
        driver = ".".join(map(str, report.cuda_version)) if report.cuda_version else "?"
        gpus = ", ".join(f"cuda:{o} {g.describe()}" for o, (g, _) in sorted(assignment.items()))
        self._availability = Availability(
            True, f"{' + '.join(labels)}, CUDA driver {driver}: {gpus}", version=" + ".join(labels)
        )
        return self._availability

    def _assigned(self) -> dict[int, tuple[Gpu, RuntimeInfo]]:
        if self._assignment is None:
            availability = self._availability or self.probe()
            if not availability.ok:
                raise BackendUnavailableError(self.name, availability.reason, availability.install_hint)
        assert self._assignment is not None
        return self._assignment

    def devices(self) -> list[Device]:
        if not (self._availability or self.probe()).ok:
            return []
        return [Device("cuda", o, f"{g.describe()}, {r.label}") for o, (g, r) in sorted(self._assigned().items())]

    def check(self, graph: Graph) -> SupportReport:
        """Pre-flight without the runtime: non-ONNX domains, operators TensorRT lacks, and
        float64/string inputs. The parser reports anything else at compile time."""
        report = SupportReport(self.name)
        opset = graph.opset()
        for node in graph.nodes:
            if node.domain not in ("", "ai.onnx"):
                report.unsupported.append(
                    UnsupportedNode(
                        node.name,
                        node.op_type,
                        node.domain,
                        graph.opset(node.domain),
                        "custom-domain operators need a TensorRT plugin",
                    )
                )
            elif node.op_type in UNSUPPORTED_OPS:
                report.unsupported.append(
                    UnsupportedNode(node.name, node.op_type, "", opset, "not supported by TensorRT's ONNX parser")
                )
        for info in [*graph.inputs, *graph.outputs]:
            why = UNSUPPORTED_TYPES.get(info.dtype.name)
            if why:
                report.unsupported.append(
                    UnsupportedNode(info.name, "<graph input/output>", "", opset, f"{info.describe()}: {why}")
                )
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit_trt.compiled import TrtCompiledModel

        assigned = self._assigned()
        if device.kind != "cuda":
            raise DeviceError(f"the tensorrt backend runs on cuda devices, not {device}")
        ordinal = 0 if device.index is None else device.index
        if ordinal not in assigned:
            listed = ", ".join(f"cuda:{o}" for o in sorted(assigned)) or "none"
            raise DeviceError(f"the tensorrt backend has no device cuda:{ordinal}; its devices: {listed}")
        gpu, runtime = assigned[ordinal]
        if options.precision not in (*(self.precisions or ()), "fp8"):
            raise OptionError(f"the tensorrt backend compiles fp32, fp16 or fp8, not {options.precision}")
        if options.precision == "fp8" and gpu.compute_capability < FP8_MIN_CC:
            raise DeviceError(
                f"precision 'fp8' needs compute capability 8.9 (Ada) or newer; cuda:{ordinal} is {gpu.describe()}"
            )
        profiles = parse_profiles(options.extra.get("profiles", {}), graph.inputs)
        trt = import_runtime(runtime)
        problem = fp8_problem(trt, runtime.label) if options.precision == "fp8" else ""
        if problem:
            raise OptionError(f"precision 'fp8': {problem}; use precision='fp16'")
        if runtime.is_rtx:
            sms = sms_from_module(trt)
            if sms and gpu.sm not in sms:
                raise DeviceError(f"{runtime.label} does not build for {gpu.describe()}")
        return TrtCompiledModel(
            trt=trt, runtime=runtime, gpu=gpu, graph=graph, weights=weights, options=options, profiles=profiles
        )
