"""A ``GenerationRequest`` as ``StableDiffusion.generate_image`` keywords, field by field.

Every field sdkit's request has is either passed on, with its meaning kept, or refused with an
``OptionError`` naming it when stable-diffusion.cpp cannot do what it asks (a second ControlNet
unit, A1111's mask blur, "only masked" inpainting, starting latents...): nothing is dropped silently.

- sampler / schedule: ``sdkit_sdcpp.names`` (``dpmpp_2m`` + ``karras`` -> ``dpm++2m`` + ``karras``).
- vae_tiling / vae_tile_size: sd.cpp tiles in latent cells: ``vae_tile_size // 8`` a side, with
  sdkit's overlap (a quarter of a tile).
- enable_hr and its fields: sd.cpp's own hires fix (``hires_*``); the upscaler names map
  ("Latent (nearest-exact)" -> ``latent_nearest_exact``).
- prompt_weighting: sd.cpp always reads A1111's emphasis (``(word:1.2)``, ``[word]``, ``BREAK``).
  "a1111" is that; "none" (sdkit's default, the text as written) is honoured only for a prompt
  without that syntax, else refused: sd.cpp would weight it anyway.
- control: one ControlNet unit -> ``control_image`` + ``control_strength`` (the ControlNet file is
  loaded with the model: ``set_controlnets``); more units, another model, start/end are refused.
- reference_images (``SdcppFlowRequest``) -> ``ref_images`` on the families that read them.
- LoRAs (``Pipeline.set_loras``) go to sd.cpp as ``<lora:ABSOLUTE_PATH:strength>`` tags appended to
  the prompt (how the binding passes them); A1111 tags the prompt already has are taken out of the
  text first, as sdkit's tokenizers do (the CLI's ``--lora-dir`` resolved them into ``set_loras``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sdkit.errors import OptionError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.features.lora_embeddings_vae import LORA_TAG
from sdkit_sdcpp.names import to_sdcpp

HIRES_UPSCALERS = {
    "Latent": "latent",
    "Latent (nearest)": "latent_nearest",
    "Latent (nearest-exact)": "latent_nearest_exact",
    "Latent (antialiased)": "latent_antialiased",
    "Latent (bicubic)": "latent_bicubic",
    "Latent (bicubic antialiased)": "latent_bicubic_antialiased",
    "Lanczos": "lanczos",
    "Nearest": "nearest",
}
# The families whose stable-diffusion.cpp models take reference images (``ref_images``): FLUX.1
# Kontext (its tensor names are FLUX.1's), FLUX.2, Qwen-Image edit (Qwen-Image's).
REFERENCE_FAMILIES = ("FLUX.1", "FLUX.2", "Qwen-Image")
TILE_OVERLAP = 0.25  # sdkit's: a quarter of the tile (sdkit.pipelines.stages.vae)
EMPHASIS = re.compile(r"[()\[\]]|\bBREAK\b")


def _asked(request: GenerationRequest) -> dict[str, str]:
    """The fields sd.cpp has no counterpart for that ``request`` sets, with what they ask for."""
    asked = {
        "max_sequence_length": getattr(request, "max_sequence_length", None) is not None,
        "latents": request.latents is not None,
        "mask_blur": request.mask_blur != 0,
        "inpaint_full_res": request.inpaint_full_res,
        "paste_back": bool(request.paste_back),  # None (the default) and False: sd.cpp does not paste
        "restore_faces": getattr(request, "restore_faces", None) is not None,
    }
    whats = {
        "max_sequence_length": "a T5 token count (it takes the prompt's own)",
        "latents": "starting latents (it draws its own noise from the seed)",
        "mask_blur": "A1111's mask blur (blur the mask yourself; 0 is sd.cpp's)",
        "inpaint_full_res": "A1111's 'only masked' inpainting",
        "paste_back": "pasting the result back under the mask",
        "restore_faces": "face restoration (run sdkit.restore_faces on its images)",
    }
    return {name: whats[name] for name, yes in asked.items() if yes}


def refuse_unsupported_fields(request: GenerationRequest) -> None:
    """An ``OptionError`` naming the first field set to something sd.cpp cannot do."""
    asked = _asked(request)
    if asked:
        name, what = next(iter(asked.items()))
        raise OptionError(f"{name}: stable-diffusion.cpp does not do {what}")
    if request.prompt_weighting == "none":
        for field in ("prompt", "negative_prompt"):
            text = LORA_TAG.sub("", getattr(request, field))
            if EMPHASIS.search(text):
                raise OptionError(
                    f"prompt_weighting='none': stable-diffusion.cpp always reads A1111 emphasis, and the "
                    f"{field} has some (brackets or BREAK); pass prompt_weighting='a1111' (--prompt-weighting "
                    "a1111) to accept it"
                )


def lora_prompt(prompt: str, loras: Sequence[tuple[Path, float]]) -> str:
    """``prompt`` without its A1111 LoRA tags, with sd.cpp's tags for ``loras`` appended."""
    text = LORA_TAG.sub("", prompt)
    tags = "".join(f"<lora:{path}:{strength!r}>" for path, strength in loras)
    return text + tags


def control_kwargs(request: GenerationRequest, width: int, height: int, controlnet: str | None) -> dict[str, Any]:
    """One ControlNet unit as sd.cpp's ``control_image`` (the unit's hint, preprocessed, resized
    with Lanczos to the generation size as sdkit's pipelines do) and ``control_strength`` (its
    scale). sd.cpp loads one ControlNet with the model and applies it at every step: a second unit,
    a unit naming another ControlNet, or a start/end other than 0/1 is refused naming the field."""
    units = request.control
    if not units:
        return {}
    if len(units) > 1:
        raise OptionError(f"control: stable-diffusion.cpp runs one ControlNet unit per generation, not {len(units)}")
    if controlnet is None:
        raise OptionError(
            "control: no ControlNet is loaded (load_pipeline(..., controlnets=FILE) or pipe.set_controlnets(FILE))"
        )
    [unit] = units
    if unit.model not in (None, controlnet):
        raise OptionError(f"control[0].model: {unit.model!r} is not loaded (stable-diffusion.cpp has {controlnet!r})")
    if unit.start != 0.0 or unit.end != 1.0:
        raise OptionError(
            f"control[0].start/end ({unit.start:g}, {unit.end:g}): stable-diffusion.cpp applies its ControlNet "
            "at every step (0, 1)"
        )
    from PIL import Image

    image = Image.fromarray(unit.hint)
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    return {"control_image": image, "control_strength": float(unit.scale)}


def reference_kwargs(request: GenerationRequest, family: str) -> dict[str, Any]:
    """``reference_images`` (``SdcppFlowRequest``) as sd.cpp's ``ref_images``: FLUX.1 Kontext,
    FLUX.2 and Qwen-Image edit models read them; any other family is refused naming the field."""
    images = getattr(request, "reference_images", ())
    if not images:
        return {}
    if not family.startswith(REFERENCE_FAMILIES) or family == "FLUX.1 Fill":
        raise OptionError(
            f"reference_images: a {family or 'this'} model takes no reference images (FLUX.1 Kontext, FLUX.2 and "
            "Qwen-Image edit models do)"
        )
    return {"ref_images": [image.convert("RGB") for image in images]}


PHOTOMAKER_FIELDS = ("photomaker_images", "photomaker_style_strength", "photomaker_id_embeddings")
PHOTOMAKER_TRIGGER = re.compile(r"\bimg\b")


def photomaker_kwargs(request: GenerationRequest, loaded: bool) -> dict[str, Any]:
    """PhotoMaker's fields (``SdcppRequest``) as sd.cpp's ``pm_id_images``, ``pm_style_strength``,
    ``pm_id_embed_path``. Set without a PhotoMaker file loaded (``photo_maker=``, SDXL only), or
    without the trigger word ``img`` in the prompt, they are refused naming the field; a loaded
    PhotoMaker with no ID images is refused too (sd.cpp would generate without it)."""
    asked = [name for name in PHOTOMAKER_FIELDS if getattr(request, name, None) not in (None, ())]
    if not loaded:
        if asked:
            raise OptionError(
                f"{asked[0]}: no PhotoMaker is loaded (an SDXL model with load_pipeline(..., photo_maker=FILE), "
                "--photo-maker FILE)"
            )
        return {}
    images = getattr(request, "photomaker_images", ())
    if not images:
        raise OptionError("photomaker_images: a PhotoMaker is loaded; give the person's ID images (or a folder)")
    if not PHOTOMAKER_TRIGGER.search(LORA_TAG.sub("", request.prompt)):
        raise OptionError("prompt: PhotoMaker needs its trigger word after the class word ('a photo of a man img')")
    kwargs: dict[str, Any] = {"pm_id_images": [image.convert("RGB") for image in images]}
    strength = getattr(request, "photomaker_style_strength", None)
    if strength is not None:
        kwargs["pm_style_strength"] = float(strength)
    embeddings = getattr(request, "photomaker_id_embeddings", None)
    if embeddings is not None:
        kwargs["pm_id_embed_path"] = embeddings
    return kwargs


def hires_kwargs(request: GenerationRequest) -> dict[str, Any]:
    if not request.enable_hr:
        return {}
    upscaler = HIRES_UPSCALERS.get(request.hr_upscaler)
    if upscaler is None:
        raise OptionError(
            f"hr_upscaler {request.hr_upscaler!r}: stable-diffusion.cpp's hires fix has {', '.join(HIRES_UPSCALERS)}"
        )
    return {
        "hires": True,
        "hires_upscaler": upscaler,
        "hires_scale": float(request.hr_scale),
        "hires_width": int(request.hr_resize_x),
        "hires_height": int(request.hr_resize_y),
        "hires_steps": int(request.hr_second_pass_steps),
        "hires_denoising_strength": float(request.denoising_strength),
    }


def generate_kwargs(
    request: GenerationRequest,
    width: int,
    height: int,
    loras: Sequence[tuple[Path, float]] = (),
    family: str = "",
    controlnet: str | None = None,
) -> dict[str, Any]:
    """``generate_image`` keywords for ``request`` at ``width`` x ``height`` (sd.cpp's defaults
    for everything the request does not set). On FLUX.1/FLUX.2 (``family``, as the file's
    tensor names say) ``guidance_scale`` is the distilled guidance and there is no CFG, as in
    sdkit's own Flux pipeline."""
    refuse_unsupported_fields(request)
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
        "batch_count": int(request.num_images),
    }
    if family.startswith("FLUX"):
        kwargs.update(cfg_scale=1.0, guidance=float(request.guidance_scale))
    if request.init_image is not None:
        kwargs["init_image"] = request.init_image.convert("RGB")
        kwargs["strength"] = float(request.strength)
    if request.mask is not None:
        from PIL import Image

        kwargs["mask_image"] = Image.fromarray(request.mask, mode="L")
    if request.vae_tiling:
        cells = request.vae_tile_size // 8
        kwargs.update(vae_tiling=True, vae_tile_size=f"{cells}x{cells}", vae_tile_overlap=TILE_OVERLAP)
    kwargs.update(hires_kwargs(request))
    kwargs.update(control_kwargs(request, width, height, controlnet))
    kwargs.update(reference_kwargs(request, family))
    return kwargs
