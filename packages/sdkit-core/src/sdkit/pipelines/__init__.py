"""Stable Diffusion 1.x/2.x and SDXL pipelines: txt2img and img2img (SDXL: + refiner) on any backend.

    import sdkit
    pipe = sdkit.load_pipeline("path/to/sd15-onnx", backend="auto")
    [image] = pipe.generate("a photo of an astronaut", seed=1, steps=20, sampler="euler_a")

    request = sdkit.pipelines.GenerationRequest.create("a photo of an astronaut", seed=1)
    [image] = pipe.run(request)

See ``PIPELINES.md`` in sdkit-core for the structure (request, config, component sources, the
shared denoising loop, loaders), the folder layout, the RNG contract and the memory policies.
"""

from __future__ import annotations

from sdkit.pipelines.base import GenerationPlan, Pipeline
from sdkit.pipelines.components import Component, LoadSettings
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.denoise import DenoiseLoop, DenoiserInputs, Step, StepHook
from sdkit.pipelines.diffusers_folder import DiffusersOnnxLoader
from sdkit.pipelines.images import GenerationParameters, save_png
from sdkit.pipelines.loading import PipelineLoader, load_pipeline
from sdkit.pipelines.request import GenerationRequest
from sdkit.pipelines.rng import NoiseStream
from sdkit.pipelines.sdxl import StableDiffusionXLPipeline
from sdkit.pipelines.sdxl_request import XLRequest
from sdkit.pipelines.sources import ModelInMemory, ModelSource, OnnxFileSource
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.pipelines.tokenizer import ClipTokenizer, PromptTruncatedWarning

__all__ = [
    "ClipTokenizer",
    "Component",
    "DenoiseLoop",
    "DenoiserInputs",
    "DiffusersOnnxLoader",
    "GenerationParameters",
    "GenerationPlan",
    "GenerationRequest",
    "LoadSettings",
    "ModelInMemory",
    "ModelSource",
    "NoiseStream",
    "OnnxFileSource",
    "Pipeline",
    "PipelineConfig",
    "PipelineLoader",
    "PromptTruncatedWarning",
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "Step",
    "StepHook",
    "XLRequest",
    "load_pipeline",
    "save_png",
]
