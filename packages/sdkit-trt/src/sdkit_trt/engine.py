"""One deserialized engine: refit from ONNX weights, an execution context, and running it.

Only used with a GPU and the vendor modules present (unverified in CI: see the README).
Refit goes through TensorRT's ONNX parser-refitter with the complete model every time, so
every refittable weight is overwritten and the parser maps ONNX initializer names to engine
weights exactly as it did at build time. TensorRT-RTX contexts get a runtime cache (the
kernels its JIT compiles), loaded from and saved to sdkit's cache folder.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sdkit.errors import InputError, SdkitError
from sdkit_trt.build import make_logger
from sdkit_trt.cuda_mem import DeviceBuffer, PinnedBuffer, Stream, copy_to_device, copy_to_host
from sdkit_trt.onnx_source import OnnxSource
from sdkit_trt.store import read_bytes, write_atomic


class TrtEngine:
    """A deserialized plan with one execution context, run on its owner's stream."""

    def __init__(self, trt: ModuleType, plan: bytes, is_rtx: bool, runtime_cache: Path | None) -> None:
        self.trt = trt
        self.logger = make_logger(trt)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise SdkitError("TensorRT could not load the cached engine: " + "; ".join(self.logger.errors[-3:]))
        self.is_rtx = is_rtx
        self.runtime_cache_path = runtime_cache
        self.context: Any = None
        self._cache_saved = False
        self._runtime_config: Any = None
        self._runtime_cache: Any = None
        self._buffers: dict[tuple[tuple[str, tuple[int, ...]], ...], dict[str, tuple[DeviceBuffer, PinnedBuffer]]] = {}
        self.io = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in self.io if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in self.io if n not in self.input_names]

    def refittable_names(self) -> list[str]:
        refitter = self.trt.Refitter(self.engine, self.logger)
        return [str(n) for n in refitter.get_all_weights()]

    def refit(self, source: OnnxSource, stream: Stream) -> list[str]:
        """Overwrite every refittable weight from ``source``; returns the refittable names."""
        refitter = self.trt.Refitter(self.engine, self.logger)
        parser_refitter = self.trt.OnnxParserRefitter(refitter, self.logger)
        ok = (
            parser_refitter.refit_from_file(source.path)
            if source.path
            else parser_refitter.refit_from_bytes(source.data)
        )
        if not ok:
            errors = [str(parser_refitter.get_error(i).desc()) for i in range(parser_refitter.num_errors)]
            raise InputError("TensorRT rejected the weights: " + "; ".join(errors or self.logger.errors[-3:]))
        missing = list(refitter.get_missing_weights())
        if missing:
            raise InputError(f"refit left {len(missing)} engine weight(s) unset, e.g. {missing[0]!r}")
        stream.synchronize()  # refit_cuda_engine needs the engine idle
        if not refitter.refit_cuda_engine():
            raise InputError("TensorRT could not refit the engine: " + "; ".join(self.logger.errors[-3:]))
        return [str(n) for n in refitter.get_all_weights()]

    def _ensure_context(self) -> Any:
        if self.context is not None:
            return self.context
        if self.is_rtx and hasattr(self.engine, "create_runtime_config"):
            self._runtime_config = self.engine.create_runtime_config()
            self._runtime_cache = self._runtime_config.create_runtime_cache()
            blob = read_bytes(self.runtime_cache_path) if self.runtime_cache_path else b""
            if blob:
                self._runtime_cache.deserialize(blob)
            self._runtime_config.set_runtime_cache(self._runtime_cache)
            self.context = self.engine.create_execution_context(self._runtime_config)
        else:
            self.context = self.engine.create_execution_context()
        if self.context is None:
            raise SdkitError("TensorRT could not create an execution context: " + "; ".join(self.logger.errors[-3:]))
        return self.context

    def save_runtime_cache(self) -> None:
        if self._runtime_cache is not None and self.runtime_cache_path is not None:
            blob = self._runtime_cache.serialize()
            if blob is not None:
                write_atomic(self.runtime_cache_path, bytes(memoryview(blob)))

    def _buffers_for(self, feeds: dict[str, np.ndarray], context: Any) -> dict[str, tuple[DeviceBuffer, PinnedBuffer]]:
        key = tuple(sorted((n, tuple(a.shape)) for n, a in feeds.items()))
        if key in self._buffers:
            return self._buffers[key]
        buffers: dict[str, tuple[DeviceBuffer, PinnedBuffer]] = {}
        for name in self.io:
            if name in feeds:
                shape = tuple(feeds[name].shape)
            else:
                shape = tuple(int(d) for d in context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise SdkitError(
                        f"output {name!r} has a data-dependent shape {list(shape)}, which sdkit-trt does not handle"
                    )
            dtype = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))
            host = PinnedBuffer(shape, dtype)
            buffers[name] = (DeviceBuffer(host.nbytes), host)
        self._buffers[key] = buffers
        return buffers

    def execute(self, feeds: dict[str, np.ndarray], stream: Stream) -> dict[str, np.ndarray]:
        context = self._ensure_context()
        for name in self.input_names:
            if not context.set_input_shape(name, tuple(feeds[name].shape)):
                raise InputError(f"TensorRT refused shape {list(feeds[name].shape)} for input {name!r}")
        buffers = self._buffers_for(feeds, context)
        for name in self.input_names:
            device, host = buffers[name]
            np.copyto(host.array, feeds[name].astype(host.array.dtype, copy=False))
            copy_to_device(device, host, stream)
        for name, (device, _) in buffers.items():
            context.set_tensor_address(name, device.ptr)
        if not context.execute_async_v3(stream.ptr):
            raise SdkitError("TensorRT execution failed: " + "; ".join(self.logger.errors[-3:]))
        for name in self.output_names:
            device, host = buffers[name]
            copy_to_host(host, device, stream)
        stream.synchronize()
        if not self._cache_saved:  # TensorRT-RTX JIT-compiled its kernels during this first run
            self.save_runtime_cache()
            self._cache_saved = True
        return {name: buffers[name][1].array.copy() for name in self.output_names}

    def close(self) -> None:
        self.save_runtime_cache()
        for buffers in self._buffers.values():
            for device, host in buffers.values():
                device.close()
                host.close()
        self._buffers.clear()
        self.context = None
        self._runtime_config = None
        self._runtime_cache = None
        self.engine = None
