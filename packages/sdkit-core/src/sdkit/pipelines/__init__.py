"""Stable Diffusion 1.x/2.x and SDXL pipelines (txt2img, img2img, inpainting, ControlNet, hires
fix, SDXL refiner), SD3, Flux.1 and Chroma (txt2img, img2img) on any backend, for every registered
model family, from single files and from diffusers ONNX folders alike.

    import sdkit
    pipe = sdkit.load_pipeline("dreamshaper_8.safetensors", backend="auto")   # or an ONNX folder
    [image] = pipe.generate("a photo of an astronaut", seed=1, steps=20, sampler="euler_a")

    request = sdkit.pipelines.GenerationRequest.create("a photo of an astronaut", seed=1)
    [image] = pipe.run(request)

Sub-packages by role: ``loaders`` (a path to a pipeline), ``models`` (the pipeline classes),
``features`` (ControlNet, inpainting, hires fix, LoRA/embeddings/VAE files), ``text`` (tokenizers,
prompt weights, encoding), ``stages`` (components, the denoising loop, the VAE), ``imaging`` (image
and latent maths); ``request``, ``control_units`` and ``config`` are what they all speak. This
module re-exports the public names. See ``PIPELINES.md`` in sdkit-core for the structure, the
folder layout, the RNG contract and the memory policies, and ``LAYERS.md`` for the import layers.
"""

from __future__ import annotations

from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.features.feature import Feature
from sdkit.pipelines.imaging.images import GenerationParameters, save_png
from sdkit.pipelines.loaders.diffusers_folder import DiffusersOnnxLoader
from sdkit.pipelines.loaders.loading import PipelineLoader, load_pipeline
from sdkit.pipelines.loaders.single_file import CheckpointLoader
from sdkit.pipelines.models.base import Pipeline
from sdkit.pipelines.models.chroma import ChromaPipeline
from sdkit.pipelines.models.flow import FlowPipeline
from sdkit.pipelines.models.flow_request import FlowRequest
from sdkit.pipelines.models.flux import FluxPipeline
from sdkit.pipelines.models.sd3 import StableDiffusion3Pipeline
from sdkit.pipelines.models.sdxl import StableDiffusionXLPipeline
from sdkit.pipelines.models.sdxl_request import XLRequest
from sdkit.pipelines.models.stable_diffusion import StableDiffusionPipeline
from sdkit.pipelines.request import GenerationPlan, GenerationRequest
from sdkit.pipelines.stages.components import Component, LoadSettings
from sdkit.pipelines.stages.denoise import DenoiseLoop, DenoiserInputs, Step, StepHook
from sdkit.pipelines.stages.faces import restore as restore_faces
from sdkit.pipelines.stages.rng import NoiseStream
from sdkit.pipelines.stages.sources import GraphWithWeights, ModelInMemory, ModelSource, OnnxFileSource
from sdkit.pipelines.stages.upscaler import ModelUpscaler, load_upscaler, upscale
from sdkit.pipelines.text.clip_tokenizer import ClipTokenizer, PromptTruncatedWarning

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
    "ModelUpscaler",
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
    "load_upscaler",
    "restore_faces",
    "save_png",
    "upscale",
]
