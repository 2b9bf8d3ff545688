"""``GgmlBackend``: the ONNX -> ggml compiler as an sdkit backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, SupportReport
from sdkit.errors import BackendUnavailableError, OptionError

if TYPE_CHECKING:
    from sdkit.backend import CompiledModel
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


# fp16: matrix and conv weights stored F16; q8_0: matrix weights Q8_0 (conv kernels F16);
# activations and accumulation stay F32 in every case
PRECISIONS = ("fp32", "fp16", "q8_0")


class GgmlBackend(Backend):
    name: ClassVar[str] = "ggml"
    priority: ClassVar[int] = 55
    description: ClassVar[str] = "ONNX compiled to ggml graphs (CPU, CUDA, Vulkan, Metal)"
    # conv: "im2col", "direct" or "auto" (timed per shape; compiler/conv_strategy.py);
    # flash_attn: "auto", "on", "off"; f16_activations: "on", "off"; matmul_prec: "default",
    # "f32" (compiler/lowering_modes.py)
    extra_options: ClassVar[Mapping[str, type | tuple[type, ...]]] = {
        "conv": str,
        "flash_attn": str,
        "f16_activations": str,
        "matmul_prec": str,
    }
    precisions: ClassVar[tuple[str, ...] | None] = PRECISIONS

    def probe(self) -> Availability:
        from sdkit_ggml.converter_plugins import default_registry
        from sdkit_ggml.runtime.buildinfo import build_note
        from sdkit_ggml.runtime.lib import INSTALL_HINT, load_library

        try:
            lib = load_library()
        except BackendUnavailableError as exc:
            return Availability(False, exc.reason, exc.install_hint or INSTALL_HINT)
        # collect converter plugins now, so a failing one shows in `sdkit backends` / `doctor`
        default_registry()
        return Availability(True, f"ggml {lib.version} from {lib.directory}{build_note(lib)}", version=lib.version)

    def devices(self) -> list[Device]:
        from sdkit_ggml.runtime.devices import list_devices
        from sdkit_ggml.runtime.lib import load_library

        try:
            lib = load_library()
        except BackendUnavailableError:
            return []
        return [d.device for d in list_devices(lib)]

    def check(self, graph: Graph) -> SupportReport:
        """Every node compile would refuse, found by the compile walk itself over shapes alone
        (``compiler/check.py``); what needs weights or input values is left to compile."""
        from sdkit_ggml.compiler.check import check_graph
        from sdkit_ggml.converter_plugins import default_registry

        registry = default_registry()
        result = check_graph(graph.proto, registry)
        notes = [
            f"converter {o.op_type} (domain {o.domain or 'ai.onnx'}, since opset {o.since_version}) "
            f"of plugin {o.by!r} replaces plugin {o.replaced!r}'s"
            for o in registry.overrides()
        ]
        return SupportReport(self.name, list(result.unsupported), notes + result.notes())

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit.options import physical_cores
        from sdkit_ggml.compiled import GgmlCompiledModel
        from sdkit_ggml.compiler.conv_strategy import conv_mode
        from sdkit_ggml.compiler.lowering_modes import f16_activations_mode, flash_attn_mode, matmul_prec_mode
        from sdkit_ggml.conv_tuning import ConvTuner
        from sdkit_ggml.converter_plugins import default_registry
        from sdkit_ggml.runtime.devices import find_device, open_backend
        from sdkit_ggml.runtime.lib import load_library

        if options.precision not in PRECISIONS:
            raise OptionError(f"the ggml backend supports precision {', '.join(PRECISIONS)}, not {options.precision!r}")
        mode = conv_mode(options.extra.get("conv"))  # a bad value is an OptionError before any work
        flash_attn_mode(options.extra.get("flash_attn"))
        f16_activations_mode(options.extra.get("f16_activations"))
        matmul_prec_mode(options.extra.get("matmul_prec"))
        lib = load_library()
        entry = find_device(lib, device)
        backend = open_backend(lib, entry)
        timer = None
        if mode == "auto":
            threads = options.threads or physical_cores()
            timer = ConvTuner(lib, backend, entry.device, threads, options)
        return GgmlCompiledModel(
            graph, weights, entry.device, options,
            lib=lib, backend=backend, registry=default_registry(), conv_timer=timer,
        )  # fmt: skip
