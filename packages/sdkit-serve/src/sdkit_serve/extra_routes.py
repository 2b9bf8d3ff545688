"""The endpoints for what a prompt and its units name beside the model: LoRAs and embeddings
(``/sdapi/v1/loras``, ``refresh-loras``, ``embeddings``) and the A1111
ControlNet extension's (``/controlnet/model_list``, ``module_list``, ``detect``). Paths in the
answers are relative to their folder: a client learns no absolute path of the server."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from sdkit.errors import InputError
from sdkit_serve.a1111_fields import MODULES, preprocessor_of
from sdkit_serve.engine import Engine
from sdkit_serve.images import decode_image, encode_png
from sdkit_serve.schemas import LoraItem


class DetectRequest(BaseModel):
    """The ControlNet extension's ``/controlnet/detect``: run a preprocessor on images."""

    controlnet_module: str = "none"
    controlnet_input_images: list[str] = Field(default_factory=list, max_length=16)
    controlnet_images: list[str] = Field(default_factory=list, max_length=16, description="webuiapi's name")
    controlnet_processor_res: int = 512
    controlnet_threshold_a: float = -1
    controlnet_threshold_b: float = -1


def add_extra_network_routes(router: APIRouter, engine: Engine) -> None:
    @router.get("/sdapi/v1/loras", response_model=list[LoraItem], tags=["models"])
    async def loras() -> list[LoraItem]:
        """The LoRA (and LyCORIS) files of ``--lora-dir``, by the names prompts' tags give."""
        folder = engine.config.lora_dir
        files = await run_in_threadpool(engine.lora_files)
        return [LoraItem(name=n, alias=n, path=str(p.relative_to(folder))) for n, p in files.items()] if folder else []

    @router.post("/sdapi/v1/refresh-loras", tags=["models"])
    async def refresh_loras() -> None:
        """The folder is read on every request: nothing to refresh (A1111's answer: null)."""

    @router.get("/sdapi/v1/embeddings", tags=["models"])
    async def embeddings() -> dict[str, Any]:
        """A1111's answer: the embeddings of ``--embeddings-dir`` loaded on the model and those
        skipped (with ``reason``: another family's, or a model that takes none)."""
        return engine.embeddings


def add_controlnet_routes(router: APIRouter, engine: Engine) -> None:
    limits = engine.config.limits

    @router.get("/controlnet/version", tags=["controlnet"])
    async def version() -> dict[str, int]:
        return {"version": 2}

    @router.get("/controlnet/model_list", tags=["controlnet"])
    async def model_list(update: bool = True) -> dict[str, list[str]]:
        """The ControlNet folders of ``--controlnet-dir``, by name."""
        return {"model_list": list(await run_in_threadpool(engine.controlnets))}

    @router.get("/controlnet/module_list", tags=["controlnet"])
    async def module_list(alias_names: bool = False) -> dict[str, Any]:
        """The preprocessors sdkit runs (model-free ones), by the extension's module names."""
        return {"module_list": list(MODULES), "module_detail": {}}

    @router.post("/controlnet/detect", tags=["controlnet"])
    async def detect(request: DetectRequest) -> dict[str, Any]:
        """Run ``controlnet_module`` on each image (thresholds as the extension's sliders); a
        ``controlnet_processor_res`` is reported in ``ignored`` (the image's own size is used)."""
        images = request.controlnet_input_images or request.controlnet_images
        if not images:
            raise InputError("controlnet_input_images is empty: give at least one base64 image")
        name, params = preprocessor_of(
            request.controlnet_module, request.controlnet_threshold_a, request.controlnet_threshold_b
        )

        def run() -> list[str]:
            from PIL import Image

            from sdkit.pipelines.imaging.controlnet_preprocessors import preprocess

            out = []
            for index, text in enumerate(images):
                image = np.asarray(decode_image(text, f"controlnet_input_images[{index}]", limits))
                result = preprocess(name, image, **params) if name is not None else image
                out.append(encode_png(Image.fromarray(result)))
            return out

        answer: dict[str, Any] = {"images": await run_in_threadpool(run), "info": "Success"}
        if name is not None and request.controlnet_processor_res not in (-1, 0):
            answer["ignored"] = {"controlnet_processor_res": "preprocessors run at the image's own size"}
        return answer
