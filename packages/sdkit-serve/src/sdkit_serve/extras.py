"""A1111's Extras upscaling: ``/sdapi/v1/extra-single-image``, ``/sdapi/v1/extra-batch-images``
and ``/sdapi/v1/upscalers``.

Request and response shapes are A1111's (``modules/api/models.py``): ``resize_mode`` 0 scales by
``upscaling_resize``, 1 scales to ``upscaling_resize_w`` x ``upscaling_resize_h`` (the larger
ratio, then a centred crop onto that canvas when ``upscaling_crop``); ``upscaler_1`` runs first,
``upscaler_2`` is blended in at ``extras_upscaler_2_visibility`` (``Image.blend``), as A1111's
``scripts/postprocessing_upscale.py`` does. Upscalers: "None", "Lanczos", "Nearest", and the
ESRGAN / Real-ESRGAN ``.safetensors`` files in ``$SDKIT_UPSCALER_DIR`` by A1111's names ("R-ESRGAN
4x+"...) or file stems (``sdkit.pipelines.stages.upscaler``: its scale semantics, compiled on the
server's backend, isolated as its pipelines are, the last two kept). Face restoration
(``gfpgan_visibility``, then ``codeformer_visibility`` with ``codeformer_weight``, above 0) runs
after the upscaling with the server's ``--face-dir`` files (``sdkit_serve.faces``); without them
the request is refused naming the field. Work runs on the job queue like a generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from sdkit.errors import InputError, SdkitError
from sdkit_serve.engine import Engine, served_options
from sdkit_serve.faces import ExtrasFaces
from sdkit_serve.images import decode_image, encode_png
from sdkit_serve.jobs import Job

MODEL_FREE = ("None", "Lanczos", "Nearest")


class ExtrasBase(BaseModel):
    resize_mode: int = Field(0, ge=0, le=1, description="0: scale by upscaling_resize, 1: scale to w x h")
    show_extras_results: bool = True
    gfpgan_visibility: float = Field(0.0, ge=0, le=1)
    codeformer_visibility: float = Field(0.0, ge=0, le=1)
    codeformer_weight: float = Field(0.0, ge=0, le=1)
    upscaling_resize: float = Field(2.0, gt=0, le=8)
    upscaling_resize_w: int = Field(512, ge=1)
    upscaling_resize_h: int = Field(512, ge=1)
    upscaling_crop: bool = True
    upscaler_1: str = "None"
    upscaler_2: str = "None"
    extras_upscaler_2_visibility: float = Field(0.0, ge=0, le=1)
    upscale_first: bool = False


class ExtrasSingleImageRequest(ExtrasBase):
    image: str = Field("", description="base64 image")


class FileData(BaseModel):
    data: str
    name: str = ""


class ExtrasBatchImagesRequest(ExtrasBase):
    imageList: list[FileData] = Field(default_factory=list)  # A1111's field name


class ExtrasSingleImageResponse(BaseModel):
    html_info: str
    image: str


class ExtrasBatchImagesResponse(BaseModel):
    html_info: str
    images: list[str]


class UpscalerItem(BaseModel):
    name: str
    model_name: str | None = None
    model_path: str | None = None
    model_url: str | None = None
    scale: float | None = None


def upscaler_items() -> list[UpscalerItem]:
    """The model-free upscalers, then each upscaler file found (scale read from its header)."""
    from sdkit.families.upscalers import UpscalerFile, available_upscalers

    items = [UpscalerItem(name=name, scale=4 if name != "None" else None) for name in MODEL_FREE]
    for name, path in available_upscalers().items():
        try:
            file = UpscalerFile(path)
        except SdkitError:
            continue  # not an upscaler sdkit reads: not offered
        # the file's name, not its absolute path (answers never give the server's folders away)
        items.append(UpscalerItem(name=name, model_name=path.stem, model_path=path.name, scale=file.config.scale))
        file.close()
    return items


def _model_free(image: Any, scale: float, mode: str) -> Any:
    """A1111's Lanczos / Nearest upscalers (``Upscaler.upscale`` with a PIL resize)."""
    from PIL import Image

    dest = (int(image.width * scale) // 8 * 8, int(image.height * scale) // 8 * 8)
    if min(dest) < 1:
        raise InputError(f"a {image.width}x{image.height} image scaled by {scale:g} is empty")
    resample = Image.Resampling.LANCZOS if mode == "Lanczos" else Image.Resampling.NEAREST
    return image.resize(dest, resample)


def _resolve(name: str) -> str:
    """An upscaler name as ``/sdapi/v1/upscalers`` lists it (a model-free one, or a file of the
    upscaler folder by A1111's name or file stem), never a path; an InputError listing them."""
    for known in MODEL_FREE:
        if known.lower() == name.lower():
            return known
    from sdkit.families.upscalers import available_upscalers

    files = available_upscalers()
    for listed, path in files.items():
        if name.lower() in (listed.lower(), path.stem.lower()):
            return listed
    names = ", ".join([*MODEL_FREE, *sorted(files)])
    raise InputError(f"unknown upscaler {name!r}; this server has: {names} (see /sdapi/v1/upscalers)")


class ExtrasRun:
    """One request's upscaling, run on the job queue's thread."""

    def __init__(self, payload: ExtrasBase, engine: Engine) -> None:
        self.faces = ExtrasFaces(payload, engine.config.face_dir)
        self.payload, self.engine = payload, engine
        self.first, self.second = _resolve(payload.upscaler_1), _resolve(payload.upscaler_2)
        if payload.resize_mode == 1:
            limits = engine.config.limits
            limits.check_pixels(payload.upscaling_resize_w, payload.upscaling_resize_h, "the upscaled image")

    def _upscale(self, image: Any, name: str, scale: float) -> Any:
        if name == "None":
            return image
        if name in MODEL_FREE:
            return _model_free(image, scale, name)
        from sdkit.families.upscalers import available_upscalers
        from sdkit.pipelines.stages.upscaler import load_upscaler

        path = available_upscalers().get(name)
        if path is None:  # listed when the request came, gone since
            raise InputError(f"upscaler {name!r} is no longer in the upscaler folder")
        backend = self.engine.config.backend
        device = self.engine.config.device
        upscaler = load_upscaler(
            path,
            backend if isinstance(backend, str) else "auto",
            device if isinstance(device, str) else None,
            **served_options(self.engine.config.options),
        )
        return upscaler.upscale(image, scale)

    def info(self) -> str:
        p = self.payload
        parts = []
        if p.resize_mode == 1:
            parts.append(f"Postprocess upscale to: {p.upscaling_resize_w}x{p.upscaling_resize_h}")
        else:
            parts.append(f"Postprocess upscale by: {p.upscaling_resize:g}")
        parts.append(f"Postprocess upscaler: {self.first}")
        if self.second != "None" and p.extras_upscaler_2_visibility > 0:
            parts.append(f"Postprocess upscaler 2: {self.second}")
        return ", ".join([*parts, *self.faces.info()])

    def one(self, image: Any, job: Job) -> Any:
        from PIL import Image

        p = self.payload
        scale = p.upscaling_resize
        if p.resize_mode == 1:
            scale = max(p.upscaling_resize_w / image.width, p.upscaling_resize_h / image.height)
        self.engine.config.limits.check_pixels(int(image.width * scale), int(image.height * scale), "the result")
        job.check()
        result = self._upscale(image, self.first, scale)
        if self.second != "None" and p.extras_upscaler_2_visibility > 0:
            job.check()
            other = self._upscale(image, self.second, scale)
            if other.size != result.size:
                other = other.resize(result.size, Image.Resampling.LANCZOS)
            result = Image.blend(result, other, p.extras_upscaler_2_visibility)
        if p.resize_mode == 1 and p.upscaling_crop:
            canvas = Image.new("RGB", (p.upscaling_resize_w, p.upscaling_resize_h))
            canvas.paste(result, (canvas.width // 2 - result.width // 2, canvas.height // 2 - result.height // 2))
            result = canvas
        if self.faces.steps:  # A1111's postprocessing order: Upscale, GFPGAN, CodeFormer
            backend, device = self.engine.config.backend, self.engine.config.device
            result = self.faces.run(
                result,
                backend if isinstance(backend, str) else "auto",
                device if isinstance(device, str) else None,
                job.check,
            )
        return result

    def all(self, images: list[Any], job: Job) -> list[str]:
        job.batch_count = len(images)
        out = []
        for index, image in enumerate(images):
            job.batch_no = index
            out.append(encode_png(self.one(image, job), self.info()))
        return out


def add_extras_routes(router: APIRouter, engine: Engine, run_job: Callable[[Request, Engine, Job], Any]) -> None:
    """Register the extras endpoints on ``router`` (``run_job``: the app's queue-and-wait)."""
    limits = engine.config.limits

    async def decoded(texts: list[str], what: str) -> list[Any]:
        if not texts:
            raise InputError(f"{what}: no image given")
        return [await run_in_threadpool(decode_image, t, f"{what}[{i}]", limits) for i, t in enumerate(texts)]

    @router.post("/sdapi/v1/extra-single-image", response_model=ExtrasSingleImageResponse, tags=["extras"])
    async def extra_single_image(payload: ExtrasSingleImageRequest, request: Request) -> ExtrasSingleImageResponse:
        work = ExtrasRun(payload, engine)
        images = await decoded([payload.image], "image")
        result = await run_job(request, engine, Job(lambda job: work.all(images, job), "extras"))
        return ExtrasSingleImageResponse(html_info=f"<p>{work.info()}</p>", image=result[0])

    @router.post("/sdapi/v1/extra-batch-images", response_model=ExtrasBatchImagesResponse, tags=["extras"])
    async def extra_batch_images(payload: ExtrasBatchImagesRequest, request: Request) -> ExtrasBatchImagesResponse:
        work = ExtrasRun(payload, engine)
        if len(payload.imageList) > limits.max_batch:
            raise InputError(f"{len(payload.imageList)} images is over this server's limit of {limits.max_batch}")
        images = await decoded([f.data for f in payload.imageList], "imageList")
        result = await run_job(request, engine, Job(lambda job: work.all(images, job), "extras"))
        return ExtrasBatchImagesResponse(html_info=f"<p>{work.info()}</p>", images=result)

    @router.get("/sdapi/v1/upscalers", response_model=list[UpscalerItem], tags=["models"])
    async def upscalers() -> list[UpscalerItem]:
        return await run_in_threadpool(upscaler_items)
