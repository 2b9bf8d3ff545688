"""``sdkit generate``'s flags for what only stable-diffusion.cpp runs (sdkit-sdcpp): Wan video
(``--video-frames N``: an animated WebP and one PNG per frame) and SDXL PhotoMaker, under
stable-diffusion.cpp's own flag names. Each is a field of the model's request class; a model whose
request lacks it (video flags on an image model, PhotoMaker on a video model) is refused naming
the flag, before the model loads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdkit.errors import InputError

# flag -> (request field, type, help)
FLAGS: dict[str, tuple[str, Any, str]] = {
    "--video-frames": (
        "video_frames",
        int,
        "Wan video: frames to make, 4k + 1 (writes NAME.webp and NAME-frame-000.png...)",
    ),
    "--fps": ("fps", int, "Wan video: frames per second of the WebP (default 16)"),
    "--end-image": (
        "end_image",
        str,
        "Wan video: the last frame (Wan2.1 FLF2V, Wan2.2 I2V); --init-image is the first",
    ),
    "--flow-shift": ("flow_shift", float, "flow models' sigma shift (default: the model's)"),
    "--high-noise-steps": ("high_noise_steps", int, "Wan2.2 14B: the high-noise expert's steps"),
    "--high-noise-cfg-scale": ("high_noise_guidance_scale", float, "Wan2.2 14B: the high-noise expert's CFG scale"),
    "--high-noise-sampling-method": ("high_noise_sampler", str, "Wan2.2 14B: the high-noise expert's sampler"),
    "--high-noise-scheduler": ("high_noise_schedule", str, "Wan2.2 14B: the high-noise expert's schedule"),
    "--moe-boundary": ("moe_boundary", float, "Wan2.2 14B: where the low-noise expert takes over (sd.cpp: 0.875)"),
    "--pm-id-images-dir": ("photomaker_images", str, "PhotoMaker (--photo-maker): a folder of the person's ID images"),
    "--pm-style-strength": ("photomaker_style_strength", float, "PhotoMaker's style strength (sd.cpp's default 20)"),
    "--pm-id-embed-path": ("photomaker_id_embeddings", str, "PhotoMaker v2: the ID embedding file"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("stable-diffusion.cpp only (--backend sdcpp): Wan video, PhotoMaker")
    for flag, (field, kind, text) in FLAGS.items():
        group.add_argument(flag, dest=f"engine_{field}", type=kind, default=None, metavar=field.upper(), help=text)


def fields(args: argparse.Namespace, request_class: type[Any]) -> dict[str, Any]:
    """The request fields the flags set, refused naming the flag where ``request_class`` lacks them."""
    known = request_class.field_names()
    out: dict[str, Any] = {}
    for flag, (field, _, _) in FLAGS.items():
        value = getattr(args, f"engine_{field}", None)
        if value is None:
            continue
        if field not in known:
            what = "a Wan video model" if flag in VIDEO_FLAGS else "an SDXL model with --photo-maker"
            raise InputError(f"{flag}: {args.model} does not take it (it needs {what} on --backend sdcpp)")
        out[field] = value
    return out


VIDEO_FLAGS = tuple(flag for flag in FLAGS if not flag.startswith("--pm-"))


def is_video(request: Any) -> bool:
    return getattr(request, "video_frames", None) is not None


def refuse_existing(path: Path, force: bool) -> None:
    """``-o NAME.png`` for a video writes NAME.webp and NAME-frame-000.png...: refused when the
    WebP or the first frame's PNG exists, unless ``--force``."""
    for existing in (path.with_suffix(".webp"), path.with_name(f"{path.stem}-frame-000.png")):
        if existing.exists() and not force:
            raise InputError(f"{existing} exists; pass --force to overwrite it, or leave out -o for numbered files")


def save_video(frames: list[Any], path: Path, fps: int, force: bool = False) -> None:
    """The frames as ``path`` with a ``.webp`` suffix and PNGs beside it; prints what it wrote."""
    from sdkit.pipelines.imaging.video import save_video as write

    refuse_existing(path, force)
    parameters = frames[0].info["sdkit_video"]
    webp, pngs = write(frames, path, parameters, fps)
    print(f"saved {webp} ({len(frames)} frames at {fps} fps) and {pngs[0].name} ... {pngs[-1].name}")
