"""The FastAPI application: A1111's ``/sdapi/v1`` endpoints in front of an ``Engine``.

``create_app(engine)`` builds it; uvicorn (``sdkit serve``) or Ray Serve (``sdkit serve --ray``)
runs it. Handlers never run the pipeline themselves: they queue a job and wait for it, watching
for the client going away, so the event loop stays free for ``/progress`` and ``/interrupt``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sdkit.errors import SdkitError
from sdkit_serve import a1111, schemas
from sdkit_serve._version import __version__
from sdkit_serve.a1111 import ImagesResponse, Img2ImgRequest, Txt2ImgRequest
from sdkit_serve.engine import Engine, GenerationResult
from sdkit_serve.extra_routes import add_controlnet_routes, add_extra_network_routes
from sdkit_serve.extras import add_extras_routes
from sdkit_serve.images import decode_image, encode_png
from sdkit_serve.jobs import Job, JobCancelled, QueueFullError
from sdkit_serve.model_choice import model_request
from sdkit_serve.model_routes import add_info_routes, add_model_routes
from sdkit_serve.schemas import ErrorResponse, ProgressResponse, ProgressState
from sdkit_serve.security import BodySizeLimit, RequestGuard, limit_json_depth, require_api_key

log = logging.getLogger("sdkit_serve")
DISCONNECT_POLL_S = 0.1  # how often a waiting request checks whether its client is still there

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "a request sdkit cannot honour (unknown sampler, over a limit, unreadable image)"),
        (401, "missing or wrong API key"),
        (413, "request body over the limit"),
        (422, "the request does not match the schema"),
        (429, "the queue is full: retry after the Retry-After header's seconds"),
        (503, "the job was cancelled (server shutting down)"),
    )
}


async def run_job(request: Request, engine: Engine, job: Job) -> Any:
    """Queue ``job`` and wait for its result; cancel it when the client disconnects."""
    future = asyncio.wrap_future(engine.queue.submit(job))
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
            if done:
                return future.result()
            if await request.is_disconnected():
                engine.queue.cancel(job, "the client disconnected")
                raise JobCancelled("the client disconnected")
    except asyncio.CancelledError:  # the server cancelled the request task (shutdown)
        engine.queue.cancel(job, "the request was cancelled")
        raise


def error_body(kind: str, detail: str, status: int, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": kind, "detail": detail, **extra}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """Every error is JSON ``{"error", "detail"}``; bad input is 4xx, never a traceback."""

    @app.exception_handler(SdkitError)
    async def sdkit_error(request: Request, exc: SdkitError) -> JSONResponse:
        return error_body(type(exc).__name__, str(exc), 400)

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        response = error_body("QueueFull", str(exc), 429)
        response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.exception_handler(JobCancelled)
    async def cancelled(request: Request, exc: JobCancelled) -> JSONResponse:
        return error_body("Cancelled", f"the job was cancelled: {exc}", 503)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = jsonable_encoder(exc.errors(), exclude={"input", "ctx", "url"})
        text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors)
        return error_body("ValidationError", text or "invalid request", 422, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_body(type(exc).__name__, str(exc.detail), exc.status_code)
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_body("InternalError", f"{type(exc).__name__}: {exc}", 500)


def create_app(engine: Engine) -> FastAPI:
    """The ASGI app for a started ``Engine``."""
    key = engine.config.api_key
    app = FastAPI(
        title="sdkit serve",
        version=__version__,
        description="AUTOMATIC1111-compatible API (/sdapi/v1) on sdkit pipelines.",
        responses=ERRORS,
        # with a key, the docs and the schema are routes behind it (add_docs_routes)
        docs_url=None if key else "/docs",
        redoc_url=None if key else "/redoc",
        openapi_url=None if key else "/openapi.json",
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=engine.config.limits.max_body_bytes)
    app.add_middleware(RequestGuard, host=engine.config.host, api_key=engine.config.api_key)  # outermost
    guards = [Depends(require_api_key(engine.config.api_key)), Depends(limit_json_depth)]
    router = APIRouter(dependencies=guards, responses=ERRORS)
    add_generation_routes(router, engine)
    add_status_routes(router, engine)
    add_model_routes(router, engine, run_job)
    add_info_routes(router, engine)
    add_extras_routes(router, engine, run_job)
    add_extra_network_routes(router, engine)
    add_controlnet_routes(router, engine)
    app.include_router(router)
    if key:
        add_docs_routes(app, key)
    app.state.engine = engine
    return app


def add_docs_routes(app: FastAPI, key: str) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc`` behind the key, as every other route. A browser
    is asked for it with HTTP Basic (any user name, the key as password), which it then sends
    with the page's own request for ``/openapi.json``."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    guard = [Depends(require_api_key(key, challenge='Basic realm="sdkit serve"'))]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guard)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=guard)
    async def docs() -> Any:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/redoc", include_in_schema=False, dependencies=guard)
    async def redoc() -> Any:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


def images_response(
    payload: Txt2ImgRequest, plan: a1111.GenerationPlan, result: GenerationResult, engine: Engine
) -> ImagesResponse:
    info = a1111.build_info(plan, result.parameters, result.model, interrupted=result.interrupted, worker=engine.worker)
    info["sd_model_hash"] = result.model_hash
    # allow_nan=False: a NaN would make `info` invalid JSON; every number in it is checked finite
    text = json.dumps(info, allow_nan=False)
    return ImagesResponse(images=result.images, parameters=a1111.echo_parameters(payload), info=text)


def add_generation_routes(router: APIRouter, engine: Engine) -> None:
    limits = engine.config.limits

    def inputs(init_image: Any = None, mask: Any = None) -> a1111.Inputs:
        return a1111.Inputs(
            init_image, mask, engine.folders, lambda text, what: decode_image(text, what, limits), engine.face_settings
        )

    def queue_generation(payload: Txt2ImgRequest, plan: a1111.GenerationPlan, kind: str) -> Job:
        """The job for a planned request, on the model it names or the one selected now."""
        models = model_request(payload, engine.catalog, engine.selected)
        task_id = getattr(payload, "force_task_id", None)
        return Job(lambda job: engine.generate(plan, job, models), kind, task_id=task_id or None)

    @router.post("/sdapi/v1/txt2img", response_model=ImagesResponse, tags=["generation"])
    async def txt2img(payload: Txt2ImgRequest, request: Request) -> ImagesResponse:
        # parsing the prompt, reading folders and preprocessing control images run off the event
        # loop, so /progress and /interrupt answer meanwhile
        limits.check_prompt(payload.prompt, payload.negative_prompt)
        plan = await run_in_threadpool(a1111.plan_generation, payload, limits, inputs())
        result = await run_job(request, engine, queue_generation(payload, plan, "txt2img"))
        return images_response(payload, plan, result, engine)

    @router.post("/sdapi/v1/img2img", response_model=ImagesResponse, tags=["generation"])
    async def img2img(payload: Img2ImgRequest, request: Request) -> ImagesResponse:
        limits.check_prompt(payload.prompt, payload.negative_prompt)
        image = await run_in_threadpool(decode_image, payload.init_images[0], "init_images[0]", limits)
        mask = await run_in_threadpool(decode_image, payload.mask, "mask", limits) if payload.mask else None
        plan = await run_in_threadpool(a1111.plan_generation, payload, limits, inputs(image, mask))
        result = await run_job(request, engine, queue_generation(payload, plan, "img2img"))
        return images_response(payload, plan, result, engine)

    @router.post("/sdapi/v1/interrupt", tags=["generation"])
    async def interrupt() -> dict[str, bool]:
        """Stop the running generation at its next step; its finished batches are returned."""
        return {"interrupted": engine.queue.interrupt()}

    @router.get("/sdapi/v1/progress", response_model=ProgressResponse, tags=["generation"])
    async def progress(skip_current_image: bool = False) -> ProgressResponse:
        return await progress_of(engine, skip_current_image)


async def progress_of(engine: Engine, skip_image: bool) -> ProgressResponse:
    job = engine.queue.current
    waiting = engine.queue.waiting()
    if job is None or job.kind not in ("txt2img", "img2img") or job.started_at is None:
        return ProgressResponse(
            progress=0.0, eta_relative=0.0, state=ProgressState(queue_pending=waiting), current_image=None
        )
    fraction = job.fraction()
    elapsed = time.monotonic() - job.started_at
    image = None
    latents = job.latents
    if not skip_image and engine.preview is not None and latents is not None:
        key = (job.id, job.batch_no, job.step)
        picture = await run_in_threadpool(engine.preview.preview, key, latents)
        image = await run_in_threadpool(encode_png, picture) if picture is not None else None
    state = ProgressState(
        interrupted=job.cancelled,
        job=job.kind,
        job_count=job.batch_count,
        job_no=job.batch_no,
        sampling_step=job.step,
        sampling_steps=job.steps,
        queue_pending=waiting,
    )
    eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
    return ProgressResponse(progress=fraction, eta_relative=eta, state=state, current_image=image)


def add_status_routes(router: APIRouter, engine: Engine) -> None:
    @router.get("/sdapi/v1/samplers", response_model=list[schemas.SamplerItem], tags=["models"])
    async def samplers() -> list[schemas.SamplerItem]:
        return schemas.samplers()

    @router.get("/sdapi/v1/schedulers", response_model=list[schemas.SchedulerItem], tags=["models"])
    async def schedulers() -> list[schemas.SchedulerItem]:
        return schemas.schedulers()
