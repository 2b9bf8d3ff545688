"""sdkit: run Stable-Diffusion-class ONNX models on whatever GPU (or CPU) a machine has.

import sdkit
model = sdkit.load_model("taef2_decoder.onnx")
compiled = sdkit.compile(model)              # backend="auto": the best one here
image = compiled.run({"latent": latent})["image"]
"""

from __future__ import annotations

from sdkit._version import __version__
from sdkit.api import (
    BackendChoice,
    BackendInfo,
    backends,
    check,
    choose_backend,
    compile,
    devices,
    load_model,
    pipeline_engines,
)
from sdkit.backend import Availability, Backend, CompiledModel, SupportReport, TensorInfo
from sdkit.device import Device
from sdkit.errors import SdkitError
from sdkit.model import Graph, Model, WeightSet
from sdkit.options import Options
from sdkit.pipelines import load_pipeline, restore_faces, upscale

__all__ = [
    "Availability",
    "Backend",
    "BackendChoice",
    "BackendInfo",
    "CompiledModel",
    "Device",
    "Graph",
    "Model",
    "Options",
    "SdkitError",
    "SupportReport",
    "TensorInfo",
    "WeightSet",
    "__version__",
    "backends",
    "check",
    "choose_backend",
    "compile",
    "devices",
    "load_model",
    "load_pipeline",
    "pipeline_engines",
    "restore_faces",
    "upscale",
]
