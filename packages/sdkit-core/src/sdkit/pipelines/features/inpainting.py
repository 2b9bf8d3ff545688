"""Inpainting, as diffusers' ``StableDiffusionInpaintPipeline`` computes it, with A1111's options
on top. The exact spec (with every random draw) is ``fixtures/tiny_xl/README.md`` section 3.3.

The mask (uint8, 255 = repaint) is blurred first when ``mask_blur > 0`` (A1111), then binarised
at >= 128 and reduced to latent size by taking the top-left pixel of each cell (diffusers,
``sdkit.pipelines.imaging.masks``). ``masked_image = image * (mask < 0.5)`` is VAE-encoded (a draw) for
every model, then:

- a 9-channel inpainting UNet gets ``concat([scaled latents, mask, masked-image latents])`` each
  step (``InpaintingInput``);
- an ordinary 4-channel UNet denoises the whole image and, after every step, the kept part is
  replaced by the init image's latents noised to the next step's level (``LatentBlend``; the
  masked-image latents are drawn but unused, as in diffusers).

``inpainting_fill`` (A1111's "masked content") changes where the repainted part starts; 1
("original", the default) is the above, as diffusers. The others, as A1111's
``StableDiffusionProcessingImg2Img.init``:

- 0 "fill": before encoding, the masked pixels of the (cropped, resized) init image are filled
  from their surroundings (``fill_masked``: the image with the masked part transparent, blurred
  with radii 256, 64, 16, 16, 4, 4, 4, 4, 2, 2, 0 and alpha-composited in that order, over the
  blurred mask at the generation size), as A1111's ``masking.fill``; the paste-back keeps the
  original;
- 2 "latent noise": the init latents' repainted cells replaced by a standard-normal draw (made
  right after the init image's posterior sample; A1111 draws it from the seed with torch);
- 3 "latent nothing": the init latents' repainted cells set to 0.

The 9-channel UNet's masked-image latents are the (filled) image's with the mask at 0, as A1111.

Then A1111's post-processing, neither of which diffusers does by default:

- ``inpaint_full_res`` ("Inpaint area: Only masked"): the mask's bounding box grown by
  ``inpaint_full_res_padding`` and widened to the generation size's aspect ratio
  (``masks.crop_region`` / ``expand_crop_region``) is cropped from the image and the mask,
  generated at width x height, resized back (Lanczos) and pasted into the original image;
- ``paste_back``: the result is blended into the original image under the blurred mask, so the
  pixels outside the mask are the original's, not the VAE's round trip (A1111 always does this;
  its overlay mask is the blurred mask with "only masked", else ``min(2 * mask, 255)``). It
  defaults to on with ``inpaint_full_res`` (A1111 and diffusers' ``padding_mask_crop`` both
  overlay there) and off otherwise, so the images are diffusers'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdkit.pipelines.config import PipelineConfig
from sdkit.pipelines.imaging.images import init_image_array
from sdkit.pipelines.imaging.masks import binarize_mask, blur_mask, crop_region, expand_crop_region, latent_mask
from sdkit.pipelines.request import GenerationRequest
from sdkit.pipelines.stages import vae
from sdkit.pipelines.stages.components import Component
from sdkit.pipelines.stages.denoise import Step, StepHook
from sdkit.pipelines.stages.rng import NoiseStream

if TYPE_CHECKING:
    from PIL import Image

Region = tuple[int, int, int, int]  # x1, y1, x2, y2 (exclusive ends) in the init image
FILL, ORIGINAL, LATENT_NOISE, LATENT_NOTHING = 0, 1, 2, 3  # A1111's inpainting_fill
FILL_BLURS = ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1))  # (radius, times composited)


@dataclass(frozen=True)
class PasteBack:
    """What the post-processing needs: the original pixels ``[H0, W0, 3]`` in [0, 1], the overlay
    alpha ``[H0, W0, 1]`` (1 = generated; None: no blending), and the crop region the generated
    image is pasted into (None: the generated image covers the whole original)."""

    original: np.ndarray
    alpha: np.ndarray | None
    region: Region | None


@dataclass(frozen=True)
class MaskPlan:
    """A request's mask at the generation size: ``image`` the VAE input ``[1, 3, H, W]`` in
    [-1, 1] (the crop with ``inpaint_full_res``), ``mask`` ``[H, W]`` 0/1 (1 = repaint),
    ``masked_image`` the image with the repainted pixels at 0, ``latent_mask`` ``[1, 1, h, w]``."""

    image: np.ndarray
    mask: np.ndarray
    masked_image: np.ndarray
    latent_mask: np.ndarray
    region: Region | None
    paste: PasteBack | None


def plan_mask(request: GenerationRequest, width: int, height: int, config: PipelineConfig) -> MaskPlan:
    """The mask of ``request`` (checked by the request: same size as the init image, not empty)
    prepared for a ``width`` x ``height`` generation."""
    from PIL import Image

    assert request.mask is not None
    assert request.init_image is not None
    source = request.init_image
    grey = blur_mask(request.mask, request.mask_blur) if request.mask_blur > 0 else request.mask
    paste_back = request.inpaint_full_res if request.paste_back is None else request.paste_back
    region: Region | None = None
    if request.inpaint_full_res:
        found = crop_region(grey, request.inpaint_full_res_padding)
        assert found is not None  # the request refuses a mask with nothing to repaint
        region = expand_crop_region(found, width, height, source.width, source.height)
        source = source.crop(region)
        working = Image.fromarray(grey).crop(region)
    else:
        working = Image.fromarray(grey)
    if working.size != (width, height):  # diffusers resizes the mask like the image (Lanczos)
        working = working.resize((width, height), Image.Resampling.LANCZOS)
    mask = binarize_mask(np.asarray(working, dtype=np.uint8))
    if request.inpainting_fill == FILL:
        source = fill_masked(_resized(source, width, height), working)
    image = init_image_array(source, width, height)
    masked = (image * (mask < 0.5)[None, None]).astype(np.float32)
    factor = config.vae_scale_factor
    small = latent_mask(mask, height // factor, width // factor)[None, None]
    paste = _paste_back(request, grey, region, width, height) if paste_back else None
    return MaskPlan(image, mask, masked, small, region, paste)


def fill_masked(image: Image.Image, mask: Image.Image) -> Image.Image:
    """A1111's "fill" (``modules/masking.py``): the pixels under ``mask`` (L, 255 = repaint)
    replaced by ever finer blurs of the rest of the image (premultiplied alpha, so the masked
    pixels do not bleed in), composited coarse to fine; the unmasked pixels are kept."""
    from PIL import Image, ImageFilter, ImageOps

    keep = ImageOps.invert(mask.convert("L"))
    premultiplied = Image.new("RGBa", image.size)
    premultiplied.paste(image.convert("RGBA").convert("RGBa"), mask=keep)
    out = Image.new("RGBA", image.size)
    for radius, repeats in FILL_BLURS:
        blurred = premultiplied.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(repeats):
            out.alpha_composite(blurred)
    return out.convert("RGB")


def _paste_back(
    request: GenerationRequest, grey: np.ndarray, region: Region | None, width: int, height: int
) -> PasteBack:
    """A1111's overlay: with "only masked" the blurred mask over the whole original; otherwise
    ``min(2 * mask, 255)`` over the original resized to the generation size."""
    from PIL import Image

    assert request.init_image is not None
    original: Image.Image = request.init_image
    if region is not None:
        alpha = grey.astype(np.float32) / 255.0
    else:
        original = _resized(original, width, height)
        overlay = Image.fromarray(grey)
        if overlay.size != (width, height):
            overlay = overlay.resize((width, height), Image.Resampling.LANCZOS)
        alpha = np.minimum(np.asarray(overlay, dtype=np.float32) * 2.0, 255.0) / 255.0
    pixels = np.asarray(original, dtype=np.float32) / 255.0
    return PasteBack(pixels, alpha[..., None], region)


def _resized(image: Image.Image, width: int, height: int) -> Image.Image:
    from PIL import Image

    return image if image.size == (width, height) else image.resize((width, height), Image.Resampling.LANCZOS)


def paste_back(pixels: np.ndarray, paste: PasteBack) -> np.ndarray:
    """Generated ``[N, H, W, 3]`` pixels in [0, 1] -> the original's size, pasted and blended."""
    out = []
    for image in pixels:
        canvas = paste.original.copy()
        if paste.region is None:
            canvas = image
        else:
            x1, y1, x2, y2 = paste.region
            canvas[y1:y2, x1:x2] = _resize_float(image, x2 - x1, y2 - y1)
        if paste.alpha is not None:
            canvas = canvas * paste.alpha + paste.original * (1.0 - paste.alpha)
        out.append(np.clip(canvas, 0.0, 1.0))
    return np.stack(out).astype(np.float32)


def _resize_float(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``[H, W, 3]`` float pixels resized with Lanczos per channel in float (no 8-bit rounding)."""
    from PIL import Image

    if image.shape[1] == width and image.shape[0] == height:
        return image
    channels = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(image[..., c])).resize((width, height), Image.Resampling.LANCZOS)
        )
        for c in range(image.shape[2])
    ]
    return np.stack(channels, axis=-1)


# -- the latent side ----------------------------------------------------------------------------


@dataclass
class InpaintingInput(StepHook):
    """A 9-channel inpainting UNet's sample: ``[scaled latents, mask, masked-image latents]``,
    the mask and latents ``[N, ...]`` repeated like the guidance-doubled sample."""

    mask: np.ndarray
    masked_latents: np.ndarray

    def model_input(self, step: Step, sample: np.ndarray) -> np.ndarray:
        reps = (sample.shape[0] // self.mask.shape[0], 1, 1, 1)
        extra = [np.tile(self.mask, reps), np.tile(self.masked_latents, reps)]
        return np.concatenate([sample, *extra], axis=1).astype(np.float32)


@dataclass
class LatentBlend(StepHook):
    """Masked img2img with an ordinary UNet: after step ``i`` the kept part (mask 0) becomes the
    init image's latents noised with the start noise to step ``i + 1``'s level (clean after the
    last step)."""

    image_latents: np.ndarray
    noise: np.ndarray
    mask: np.ndarray
    scheduler: Any

    def after_step(self, step: Step, latents: np.ndarray) -> np.ndarray:
        proper = self.image_latents
        if step.index < step.total - 1:
            following = np.asarray(self.scheduler.timesteps).reshape(-1)[step.index + 1 : step.index + 2]
            proper = self.scheduler.add_noise(self.image_latents, self.noise, following)
        blended: np.ndarray = ((1 - self.mask) * proper + self.mask * latents).astype(np.float32)
        return blended


def fill_latents(image_latents: np.ndarray, mask: np.ndarray, fill: int, noise: NoiseStream) -> np.ndarray:
    """The init latents the repainted part starts from (``mask`` 1 = repaint, at latent size):
    unchanged ("original", "fill"), a standard-normal draw there ("latent noise") or 0 ("latent
    nothing"). The kept part is the init image's either way (the blend keeps using it)."""
    if fill == LATENT_NOISE:
        drawn = noise.normal(image_latents.shape)
        return np.asarray(image_latents * (1 - mask) + drawn * mask, dtype=np.float32)
    if fill == LATENT_NOTHING:
        return np.asarray(image_latents * (1 - mask), dtype=np.float32)
    return image_latents


def inpainting_latents(
    request: GenerationRequest,
    plan: MaskPlan,
    scheduler: Any,
    encoder: Component,
    noise: NoiseStream,
    config: PipelineConfig,
    shape: tuple[int, ...],
) -> tuple[np.ndarray, StepHook]:
    """The start latents and the hook, drawing in diffusers' order: the init image's posterior
    sample (except for a 9-channel UNet at strength 1, which never uses it), the start noise
    (``request.latents`` in its place when given), the masked image's posterior sample."""
    count = request.num_images
    tile = request.vae_tile_size if request.vae_tiling else None
    full = request.strength == 1.0  # diffusers' is_strength_max: start from pure noise
    image_latents = None
    mask = np.repeat(plan.latent_mask, count, axis=0).astype(np.float32)
    start_latents = None
    if not config.inpainting or not full:
        image_latents = vae.encode(encoder, plan.image, noise, count, config, tile)
        start_latents = fill_latents(image_latents, mask, request.inpainting_fill, noise)
    drawn = noise.normal(shape)
    start = drawn if request.latents is None else request.latents
    if full:
        latents = (start * np.float32(scheduler.init_noise_sigma)).astype(np.float32)
    else:
        first = np.asarray(scheduler.timesteps).reshape(-1)[:1]
        latents = np.asarray(scheduler.add_noise(start_latents, start, first), dtype=np.float32)
    masked_latents = vae.encode(encoder, plan.masked_image, noise, count, config, tile)
    if config.inpainting:
        return latents, InpaintingInput(mask, masked_latents)
    assert image_latents is not None
    return latents, LatentBlend(image_latents, start, mask, scheduler)
