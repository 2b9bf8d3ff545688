"""``GgmlBackend``: the ONNX -> ggml compiler as an sdkit backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sdkit.backend import Availability, Backend, SupportReport
from sdkit.errors import BackendUnavailableError, OptionError, UnsupportedNode

if TYPE_CHECKING:
    import onnx

    from sdkit.backend import CompiledModel
    from sdkit.device import Device
    from sdkit.model import Graph, WeightSet
    from sdkit.options import Options


class GgmlBackend(Backend):
    name: ClassVar[str] = "ggml"
    priority: ClassVar[int] = 55
    description: ClassVar[str] = "ONNX compiled to ggml graphs (CPU, CUDA, Vulkan, Metal)"

    def probe(self) -> Availability:
        from sdkit_ggml.runtime.lib import INSTALL_HINT, load_library

        try:
            lib = load_library()
        except BackendUnavailableError as exc:
            return Availability(False, exc.reason, exc.install_hint or INSTALL_HINT)
        return Availability(True, f"ggml {lib.version} from {lib.directory}", version=lib.version)

    def devices(self) -> list[Device]:
        from sdkit_ggml.runtime.devices import list_devices
        from sdkit_ggml.runtime.lib import load_library

        try:
            lib = load_library()
        except BackendUnavailableError:
            return []
        return [d.device for d in list_devices(lib)]

    def check(self, graph: Graph) -> SupportReport:
        from sdkit_ggml.compiler.registry import default_registry
        from sdkit_ggml.compiler.static_checks import SUPPORTED_DTYPES, tensor_dtypes, unsupported_dtype

        registry = default_registry()
        report = SupportReport(self.name)
        dtypes = tensor_dtypes(graph.proto)
        opsets = {(e.domain if e.domain != "ai.onnx" else ""): int(e.version) for e in graph.proto.opset_import}
        known = set(graph.initializer_names)
        for node in graph.nodes:
            domain = node.domain if node.domain != "ai.onnx" else ""
            opset = opsets.get(domain, 1)
            if _folds_statically(node, known):
                known.update(o for o in node.output if o)
                continue
            converter = registry.lookup(domain, node.op_type, opset)
            why: str | None
            if converter is None:
                versions = registry.known(domain, node.op_type)
                why = (
                    f"no converter for opset {opset} (have: {versions})"
                    if versions
                    else "operator not supported by sdkit-ggml"
                )
            else:
                why = (converter.check(node) if converter.check else None) or unsupported_dtype(node, dtypes)
            if why:
                report.unsupported.append(
                    UnsupportedNode(node.name or node.output[0], node.op_type, domain, opset, why)
                )
        for info in graph.inputs:
            if info.dtype not in SUPPORTED_DTYPES:
                report.unsupported.append(
                    UnsupportedNode(f"input {info.name}", "<input>", "", 0, f"ggml has no {info.dtype} tensors")
                )
        return report

    def compile(self, graph: Graph, weights: WeightSet, device: Device, options: Options) -> CompiledModel:
        from sdkit_ggml.compiled import GgmlCompiledModel
        from sdkit_ggml.compiler.registry import default_registry
        from sdkit_ggml.runtime.devices import find_device, open_backend
        from sdkit_ggml.runtime.lib import load_library

        if options.precision not in ("fp32", "fp16"):
            raise OptionError(f"the ggml backend supports precision fp32 and fp16, not {options.precision!r}")
        lib = load_library()
        entry = find_device(lib, device)
        backend = open_backend(lib, entry)
        return GgmlCompiledModel(
            graph, weights, entry.device, options, lib=lib, backend=backend, registry=default_registry()
        )


def _folds_statically(node: onnx.NodeProto, known: set[str]) -> bool:
    """Constant nodes, shape queries and nodes fed only by constants fold at compile time."""
    from sdkit_ggml.compiler.fold import NOT_FOLDABLE

    if node.op_type in ("Constant", "Shape", "Size"):
        return True
    return node.op_type not in NOT_FOLDABLE and all(i in known for i in node.input if i)
