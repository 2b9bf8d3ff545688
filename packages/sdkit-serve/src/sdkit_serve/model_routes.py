"""A1111's model, option and status endpoints: ``/sdapi/v1/options``, ``sd-models``, ``sd-vae``,
``refresh-checkpoints``, ``refresh-vae``, ``png-info``, ``memory``, and the ``/internal``
endpoints its clients poll (``ping``, ``progress`` by task id)."""

from __future__ import annotations

import base64
import binascii
import io
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from sdkit.errors import InputError
from sdkit_serve.faces import face_option_ok
from sdkit_serve.images import encode_png
from sdkit_serve.infotext import memory_report, parse_infotext
from sdkit_serve.jobs import Job
from sdkit_serve.model_choice import ModelChoice
from sdkit_serve.schemas import (
    InternalProgressRequest,
    InternalProgressResponse,
    MemoryResponse,
    PNGInfoRequest,
    PNGInfoResponse,
    SDModelItem,
    SDVaeItem,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sdkit_serve.engine import Engine

PREVIEW_FORMATS = ("png",)  # previews are PNGs


def options_of(engine: Engine) -> dict[str, Any]:
    """``GET /sdapi/v1/options``: the selection and the options this server keeps."""
    checkpoint = engine.selected_checkpoint()
    return {
        "sd_model_checkpoint": checkpoint.title,
        "sd_checkpoint_hash": checkpoint.sha256,
        "sd_vae": engine.selected.vae,
        "samples_format": "png",  # images are always PNGs, with their parameters chunk
        **engine.options,
    }


def requested_choice(engine: Engine, options: dict[str, Any], ignored: dict[str, str]) -> ModelChoice:
    """The model and VAE ``options`` select (the current selection where they name none)."""
    checkpoint, vae = engine.selected.checkpoint, engine.selected.vae
    if options.get("sd_model_checkpoint") not in (None, ""):
        checkpoint = engine.catalog.find(options["sd_model_checkpoint"]).name
    if options.get("sd_vae") not in (None, ""):
        vae = engine.catalog.check_vae_option(options["sd_vae"])
    modules = options.get("forge_additional_modules")
    if modules:  # Forge's (and Easy Diffusion's) way to name a VAE: its path or file name
        if not isinstance(modules, list) or len(modules) != 1 or not isinstance(modules[0], str):
            raise InputError("forge_additional_modules: this server takes one VAE file, by name or path")
        name = Path(modules[0]).name
        if name not in engine.catalog.vaes:
            raise InputError(f"forge_additional_modules: {name!r} is not a VAE in --vae-dir (see /sdapi/v1/sd-vae)")
        vae = name
    elif modules is not None and modules != []:
        ignored["forge_additional_modules"] = "expected a list of VAE files"
    return ModelChoice(checkpoint, vae)


def set_plain_options(engine: Engine, options: dict[str, Any], ignored: dict[str, str]) -> None:
    """The options that change no model: kept if this server acts on them, else reported."""
    taken = ("sd_model_checkpoint", "sd_vae", "forge_additional_modules")
    for key, value in options.items():
        keep = (
            (key == "live_previews_enable" and isinstance(value, bool))
            or (key == "live_previews_image_format" and value in PREVIEW_FORMATS)
            or face_option_ok(key, value)  # face_restoration_model, code_former_weight (sdkit_serve.faces)
        )
        if keep:
            engine.options[key] = value
        elif key == "samples_format" and str(value).lower() == "png":
            continue
        elif key not in taken:
            ignored[key] = "not an option sdkit serve uses"


def add_model_routes(
    router: APIRouter, engine: Engine, run_job: Callable[[Request, Engine, Job], Awaitable[Any]]
) -> None:
    @router.get("/sdapi/v1/options", tags=["models"])
    async def get_options() -> dict[str, Any]:
        return options_of(engine)

    @router.post("/sdapi/v1/options", tags=["models"])
    async def set_options(options: dict[str, Any], request: Request) -> dict[str, Any]:
        """``sd_model_checkpoint`` (a title, name or hash from ``/sdapi/v1/sd-models``) and
        ``sd_vae`` switch the model and VAE, after the running job; a model that fails to load
        leaves the current one selected. ``live_previews_enable``, ``face_restoration_model`` and
        ``code_former_weight`` (for ``restore_faces``) are kept; other options are
        reported as ignored. The answer: the options now, ``ignored``, and ``switched`` (how the
        model changed: per component ``refit`` or ``recompile``, or ``{"pipeline": "loaded"}``)."""
        ignored: dict[str, str] = {}
        choice = requested_choice(engine, options, ignored)
        set_plain_options(engine, options, ignored)
        loaded = engine.loaded is not None and engine.loaded.name == choice.checkpoint
        switched: dict[str, str] = {}
        if choice != engine.selected or not loaded:
            before = engine.loaded
            await run_job(request, engine, Job(lambda job: engine.switch(choice, job), "load_model"))
            switched = dict(engine.last_switch) if engine.loaded is not before else {}
        return {**options_of(engine), "ignored": ignored, "switched": switched}

    @router.get("/sdapi/v1/sd-models", response_model=list[SDModelItem], tags=["models"])
    async def sd_models() -> list[SDModelItem]:
        return [SDModelItem.model_validate(c.item()) for c in engine.catalog.checkpoints.values()]

    @router.get("/sdapi/v1/sd-vae", response_model=list[SDVaeItem], tags=["models"])
    async def sd_vae() -> list[SDVaeItem]:
        return [
            SDVaeItem(model_name=v.name, filename=v.path.relative_to(v.root).as_posix())
            for v in engine.catalog.vaes.values()
        ]

    @router.post("/sdapi/v1/refresh-checkpoints", tags=["models"])
    async def refresh_checkpoints() -> None:
        await run_in_threadpool(engine.catalog.refresh_checkpoints)

    @router.post("/sdapi/v1/refresh-vae", tags=["models"])
    async def refresh_vae() -> None:
        await run_in_threadpool(engine.catalog.refresh_vaes)

    # Forge's name for it, which Easy Diffusion calls (not in A1111's schema, so not in ours)
    forge_refresh = "/sdapi/v1/refresh-vae-and-text-encoders"
    router.add_api_route(forge_refresh, refresh_vae, methods=["POST"], include_in_schema=False)


def read_png_info(text: str) -> PNGInfoResponse:
    """The ``parameters`` text chunk of a base64 image and its other text chunks."""
    from PIL import Image, UnidentifiedImageError

    raw_text = text.strip().split(",", 1)[1] if text.strip().startswith("data:") else text.strip()
    try:
        raw = base64.b64decode(raw_text, validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            info = dict(image.info)
    except (binascii.Error, ValueError):
        raise InputError("image is not valid base64") from None
    except UnidentifiedImageError:  # its message is the stream's repr: say it plainly
        raise InputError("image is not a readable image (no image format recognised)") from None
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InputError(f"image is not a readable image: {exc}") from None
    parameters = info.pop("parameters", None)
    geninfo = parameters if isinstance(parameters, str) else ""
    items = {k: v for k, v in info.items() if isinstance(k, str) and isinstance(v, str)}
    return PNGInfoResponse(info=geninfo, items=items, parameters=parse_infotext(geninfo) if geninfo else {})


def add_info_routes(router: APIRouter, engine: Engine) -> None:
    @router.post("/sdapi/v1/png-info", response_model=PNGInfoResponse, tags=["info"])
    async def png_info(payload: PNGInfoRequest) -> PNGInfoResponse:
        return await run_in_threadpool(read_png_info, payload.image)

    @router.get("/sdapi/v1/memory", response_model=MemoryResponse, tags=["info"])
    async def memory() -> MemoryResponse:
        return MemoryResponse(**memory_report())

    @router.get("/internal/ping", tags=["info"])
    async def ping() -> dict[str, Any]:
        return {}

    @router.post("/internal/progress", response_model=InternalProgressResponse, tags=["generation"])
    async def internal_progress(payload: InternalProgressRequest) -> InternalProgressResponse:
        """A1111 1.6+'s progress of one task (``force_task_id``): queued, running (progress,
        ETA, a preview newer than ``id_live_preview``) or completed."""
        return await task_progress(engine, payload)


async def task_progress(engine: Engine, payload: InternalProgressRequest) -> InternalProgressResponse:
    job, queued, completed = engine.queue.task_state(payload.id_task or "")
    if job is None or job.started_at is None:
        text = f"In queue: {engine.queue.waiting()} waiting" if queued else "Waiting..."
        return InternalProgressResponse(
            active=False, queued=queued, completed=completed, live_preview=None, id_live_preview=-1, textinfo=text
        )
    fraction = job.fraction()
    elapsed = time.monotonic() - job.started_at
    eta = elapsed / fraction - elapsed if fraction > 0 else None
    preview, preview_id = None, payload.id_live_preview
    wants = payload.live_preview and engine.options.get("live_previews_enable", True)
    latents, current_id = job.latents, job.preview_id
    if wants and engine.preview is not None and latents is not None and current_id != payload.id_live_preview:
        picture = await run_in_threadpool(engine.preview.preview, (job.id, job.batch_no, job.step), latents)
        if picture is not None:
            encoded = await run_in_threadpool(encode_png, picture)
            preview, preview_id = f"data:image/png;base64,{encoded}", current_id
    return InternalProgressResponse(
        active=True,
        queued=False,
        completed=False,
        progress=fraction,
        eta=eta,
        live_preview=preview,
        id_live_preview=preview_id,
        textinfo=f"Step {job.step}/{job.steps}" if job.steps else None,
    )
