"""Stable Diffusion 1.x/2.x and SDXL pipelines (txt2img, img2img, inpainting, ControlNet, hires
fix, SDXL refiner), SD3, Flux.1 and Chroma (txt2img, img2img) on any backend, for every registered
model family, from single files and from diffusers ONNX folders alike.

    import sdkit
    pipe = sdkit.load_pipeline("dreamshaper_8.safetensors", backend="auto")   # or an ONNX folder
    [image] = pipe.generate("a photo of an astronaut", seed=1, steps=20, sampler="euler_a")

    request = sdkit.pipelines.GenerationRequest.create("a photo of an astronaut", seed=1)
    [image] = pipe.run(request)

See ``PIPELINES.md`` in sdkit-core for the structure (request, config, component sources, the
shared denoising loop, loaders), the folder layout, the RNG contract and the memory policies.
"""

from __future__ import annotations

from sdkit.pipelines.base import Pipeline
from sdkit.pipelines.chroma import ChromaPipeline
from sdkit.pipelines.components import Component, LoadSettings
from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.denoise import DenoiseLoop, DenoiserInputs, Step, StepHook
from sdkit.pipelines.diffusers_folder import DiffusersOnnxLoader
from sdkit.pipelines.features import Feature
from sdkit.pipelines.flow import FlowPipeline
from sdkit.pipelines.flow_request import FlowRequest
from sdkit.pipelines.flux import FluxPipeline
from sdkit.pipelines.images import GenerationParameters, save_png
from sdkit.pipelines.loading import PipelineLoader, load_pipeline
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.rng import NoiseStream
from sdkit.pipelines.sd3 import StableDiffusion3Pipeline
from sdkit.pipelines.sdxl import StableDiffusionXLPipeline
from sdkit.pipelines.sdxl_request import XLRequest
from sdkit.pipelines.single_file import CheckpointLoader
from sdkit.pipelines.sources import GraphWithWeights, ModelInMemory, ModelSource, OnnxFileSource
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.pipelines.tokenizer import ClipTokenizer, PromptTruncatedWarning

__all__ = [
    "CheckpointLoader",
    "ChromaPipeline",
    "ClipTokenizer",
    "Component",
    "DenoiseLoop",
    "DenoiserInputs",
    "DiffusersOnnxLoader",
    "Feature",
    "FlowPipeline",
    "FlowRequest",
    "FluxPipeline",
    "GenerationParameters",
    "GenerationPlan",
    "GenerationRequest",
    "GraphWithWeights",
    "LoadSettings",
    "ModelInMemory",
    "ModelSource",
    "NoiseStream",
    "OnnxFileSource",
    "Pipeline",
    "PipelineConfig",
    "PipelineLoader",
    "PromptTruncatedWarning",
    "StableDiffusion3Pipeline",
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "Step",
    "StepHook",
    "XLRequest",
    "load_pipeline",
    "save_png",
]
