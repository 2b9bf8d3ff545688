"""Stable Diffusion pipelines: txt2img and img2img on any backend.

    import sdkit
    pipe = sdkit.load_pipeline("path/to/sd15-onnx", backend="auto")
    [image] = pipe.generate("a photo of an astronaut", seed=1, steps=20, sampler="euler_a")

See ``PIPELINES.md`` in sdkit-core for the folder layout, the RNG contract and the memory policies.
"""

from __future__ import annotations

from sdkit.pipelines.images import GenerationParameters, save_png
from sdkit.pipelines.loading import DiffusersOnnxLoader, load_pipeline
from sdkit.pipelines.rng import NoiseStream
from sdkit.pipelines.stable_diffusion import StableDiffusionPipeline
from sdkit.pipelines.tokenizer import ClipTokenizer, PromptTruncatedWarning

__all__ = [
    "ClipTokenizer",
    "DiffusersOnnxLoader",
    "GenerationParameters",
    "NoiseStream",
    "PromptTruncatedWarning",
    "StableDiffusionPipeline",
    "load_pipeline",
    "save_png",
]
