"""Wan text/image-to-video through stable-diffusion.cpp's ``generate_video``.

``SdcppVideoRequest`` is sdkit's request plus the video's fields; ``SdcppVideoPipeline`` (what
``load_pipeline`` returns for a Wan file) maps it (``video_kwargs``) and answers with the frames,
each a PIL image carrying the A1111 parameters (``Frame: i/N``, ``FPS``), which
``sdkit.pipelines.imaging.video.save_video`` writes as an animated WebP and PNGs.

Refused naming the field, never dropped: a frame count that is not 4k + 1 (sd.cpp would round it
down), the image-only fields (``num_images`` > 1, ``mask``, ``control``, ``enable_hr``), an init
image on a text-only model, an end image on a model without first/last-frame conditioning, the
high-noise expert's settings without that expert loaded, VACE control frames on a non-VACE model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sdkit.errors import InputError, OptionError
from sdkit.limits import check_generation
from sdkit.pipelines import FlowRequest, GenerationPlan, GenerationRequest
from sdkit.pipelines.features.lora_embeddings_vae import LORA_TAG
from sdkit.pipelines.imaging.images import open_init_image
from sdkit.pipelines.imaging.video import frame_parameters
from sdkit.pipelines.request import as_float, as_int
from sdkit.schedulers import resolve
from sdkit_sdcpp.names import to_sdcpp
from sdkit_sdcpp.pipeline import FLOW_FAMILIES, SdcppFlowPipeline, SdcppPipeline
from sdkit_sdcpp.request_map import lora_prompt, refuse_unsupported_fields

HIGH_NOISE_FIELDS = (
    "high_noise_steps", "high_noise_guidance_scale", "high_noise_sampler", "high_noise_schedule", "moe_boundary",
)  # fmt: skip
MAX_FRAMES = 1025


@dataclass(frozen=True, eq=False)
class SdcppVideoRequest(FlowRequest):
    """A Wan video: ``video_frames`` (4k + 1: 1, 5, 9, ... 81), ``fps`` (the WebP's rate and its
    metadata; Wan2.1 is trained at 16, Wan2.2 TI2V at 24), ``init_image`` (I2V/TI2V: the first
    frame), ``end_image`` (the last frame: Wan2.1 FLF2V, Wan2.2 I2V), ``flow_shift`` (None: sd.cpp's
    default for the model), the Wan2.2 14B high-noise expert's ``high_noise_*`` settings and
    ``moe_boundary`` (None: sd.cpp's), VACE's ``control_frames`` and ``vace_strength``."""

    video_frames: int = 33
    fps: int = 16
    end_image: Any = None
    flow_shift: float | None = None
    high_noise_steps: int | None = None
    high_noise_guidance_scale: float | None = None
    high_noise_sampler: str | None = None
    high_noise_schedule: str | None = None
    moe_boundary: float | None = None
    control_frames: tuple[Any, ...] = ()
    vace_strength: float | None = None

    @classmethod
    def checked(cls, values: dict[str, Any]) -> dict[str, Any]:
        out = super().checked(values)
        if "video_frames" in values:
            frames = as_int(values["video_frames"], "video_frames", 1)
            if (frames - 1) % 4 or frames > MAX_FRAMES:
                raise InputError(
                    f"video_frames: Wan makes 4k + 1 frames (1, 5, 9, ... 81, at most {MAX_FRAMES}), not {frames}"
                )
            out["video_frames"] = frames
        if "fps" in values:
            out["fps"] = as_int(values["fps"], "fps", 1)
        if values.get("end_image") is not None:
            out["end_image"] = open_init_image(values["end_image"], "end image")
        for name in ("flow_shift", "high_noise_guidance_scale", "moe_boundary", "vace_strength"):
            if values.get(name) is not None:
                out[name] = as_float(values[name], name)
        if values.get("high_noise_steps") is not None:
            out["high_noise_steps"] = as_int(values["high_noise_steps"], "high_noise_steps", 1)
        if values.get("high_noise_sampler") is not None or values.get("high_noise_schedule") is not None:
            # canonical names, as the request's own sampler (the request's sampler when not given)
            sampler, schedule = resolve(
                values.get("high_noise_sampler") or out["sampler"], values.get("high_noise_schedule")
            )
            out.update(high_noise_sampler=sampler, high_noise_schedule=schedule)
        given = values.get("control_frames") or ()
        out["control_frames"] = tuple(open_init_image(f, "control frame") for f in given)
        return out


def refuse_image_fields(request: SdcppVideoRequest) -> None:
    """The image-only fields a video request sets, refused naming them."""
    asked = {
        "num_images": request.num_images != 1,
        "mask": request.mask is not None,
        "control": bool(request.control),
        "enable_hr": request.enable_hr,
    }
    for name, yes in asked.items():
        if yes:
            raise OptionError(f"{name}: an image option; stable-diffusion.cpp's video generation does not take it")


def refuse_for_model(request: SdcppVideoRequest, family: str, high_noise_loaded: bool) -> None:
    """What the loaded Wan model cannot do (its family as its tensor names say, and whether the
    Wan2.2 high-noise expert was loaded), refused naming the field."""
    if request.init_image is not None and "T2V" in family:
        raise OptionError(f"init_image: a {family} model makes video from text only (I2V/TI2V models take one)")
    if request.end_image is not None and not ("I2V" in family and "TI2V" not in family):
        raise OptionError(f"end_image: a {family} model takes no last frame (Wan2.1 FLF2V and Wan2.2 I2V do)")
    if request.control_frames and "VACE" not in family:
        raise OptionError(f"control_frames: a {family} model takes no control video (Wan2.1 VACE models do)")
    if request.vace_strength is not None and "VACE" not in family:
        raise OptionError(f"vace_strength: a {family} model has no VACE")
    if not high_noise_loaded:
        for name in HIGH_NOISE_FIELDS:
            if getattr(request, name) is not None:
                raise OptionError(
                    f"{name}: no high-noise expert is loaded (Wan2.2 14B: load_pipeline(..., "
                    "high_noise_diffusion_model=FILE), --high-noise-diffusion-model)"
                )


def high_noise_kwargs(request: SdcppVideoRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if request.high_noise_sampler is not None or request.high_noise_schedule is not None:
        method, scheduler = to_sdcpp(
            request.high_noise_sampler or request.sampler, request.high_noise_schedule or "normal"
        )
        kwargs.update(high_noise_sample_method=method, high_noise_scheduler=scheduler)
    if request.high_noise_steps is not None:
        kwargs["high_noise_sample_steps"] = request.high_noise_steps
    if request.high_noise_guidance_scale is not None:
        kwargs["high_noise_cfg_scale"] = request.high_noise_guidance_scale
    if request.moe_boundary is not None:
        kwargs["moe_boundary"] = request.moe_boundary
    return kwargs


def video_kwargs(
    request: SdcppVideoRequest, width: int, height: int, loras: Any = (), family: str = "Wan", high_noise: bool = False
) -> dict[str, Any]:
    """``generate_video`` keywords for ``request`` at ``width`` x ``height``."""
    refuse_unsupported_fields(request)
    refuse_image_fields(request)
    refuse_for_model(request, family, high_noise)
    method, scheduler = to_sdcpp(request.sampler, request.schedule)
    kwargs: dict[str, Any] = {
        "prompt": lora_prompt(request.prompt, loras),
        "negative_prompt": LORA_TAG.sub("", request.negative_prompt),
        "width": width,
        "height": height,
        "cfg_scale": float(request.guidance_scale),
        "sample_method": method,
        "scheduler": scheduler,
        "sample_steps": int(request.steps),
        "seed": int(request.seed),
        "video_frames": int(request.video_frames),
    }
    if request.init_image is not None:
        kwargs["init_image"] = request.init_image.convert("RGB")
    if request.end_image is not None:
        kwargs["end_image"] = request.end_image.convert("RGB")
    if request.flow_shift is not None:
        kwargs["flow_shift"] = request.flow_shift
    if request.control_frames:
        kwargs["control_frames"] = [frame.convert("RGB") for frame in request.control_frames]
    if request.vace_strength is not None:
        kwargs["vace_strength"] = request.vace_strength
    if request.vae_tiling:
        cells = request.vae_tile_size // 8
        kwargs.update(vae_tiling=True, vae_tile_size=f"{cells}x{cells}", vae_tile_overlap=0.25)
    kwargs.update(high_noise_kwargs(request))
    return kwargs


class SdcppVideoPipeline(SdcppPipeline):
    """A Wan model (2.1/2.2, T2V/I2V/TI2V) run by stable-diffusion.cpp: ``generate``/``run`` take an
    ``SdcppVideoRequest`` and return the video's frames (``[F, H, W, 3]`` with ``output_type="np"``)."""

    request_class: ClassVar[type[GenerationRequest]] = SdcppVideoRequest

    def plan(self, request: GenerationRequest) -> GenerationPlan:
        plan = super().plan(request)
        assert isinstance(request, SdcppVideoRequest)
        refuse_image_fields(request)
        refuse_for_model(request, self.family, self.context.files.high_noise_diffusion_model is not None)
        # sdkit's memory budget before sd.cpp allocates: every frame decoded, the latents 4x fewer in time
        latent_frames = (request.video_frames - 1) // 4 + 1
        shape = (latent_frames, *plan.latent_shape[1:])
        check_generation(request.video_frames, plan.width, plan.height, shape, request.init_image is not None)
        return plan

    def run(self, request: GenerationRequest) -> Any:
        plan = self.plan(self.accept(request))
        video = plan.request
        assert isinstance(video, SdcppVideoRequest)
        high_noise = self.context.files.high_noise_diffusion_model is not None
        kwargs = video_kwargs(video, plan.width, plan.height, self.loras, self.family, high_noise)
        frames = [frame.convert("RGB") for frame in self.context.generate(kwargs, video.callback, "generate_video")]
        if video.output_type == "np":
            return np.stack([np.asarray(frame, np.float32) / 255.0 for frame in frames])
        params = self.parameters(plan, plan.seeds[0])
        for index, frame in enumerate(frames):
            framed = frame_parameters(params, index, len(frames), video.fps)
            frame.info["parameters"] = framed.a1111_text()
            frame.info["sdkit_parameters"] = framed
            frame.info["sdkit_video"] = params  # the whole video's parameters (save_video adds Frames, FPS)
        return frames


def pipeline_class(family: str) -> type[SdcppPipeline]:
    """The pipeline class for a file of ``family``: Wan's video, a flow model's, or the UNet one."""
    if family.startswith("Wan"):
        return SdcppVideoPipeline
    return SdcppFlowPipeline if family.startswith(FLOW_FAMILIES) else SdcppPipeline
