"""Inpainting beyond the diffusers goldens: the request's checks, A1111's paste-back and "only
masked" against PIL's compositing (what A1111 and diffusers' ``apply_overlay`` call), batches,
and the mask on a model that cannot use it. Tiny SD 1.x pipelines of ``fixtures/tiny_xl`` on the
reference backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

import sdkit
from sdkit.errors import InputError, ModelFormatError
from sdkit.pipelines import GenerationRequest
from sdkit.pipelines.imaging.masks import blur_mask, crop_region, expand_crop_region, open_mask
from sdkit.testing.goldens import GoldenSet

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")


@pytest.fixture(scope="module")
def images() -> dict[str, np.ndarray]:
    return {k: GOLDENS.array(k) for k in ("init_image", "mask_image")}


@pytest.fixture(scope="module")
def sd15() -> Any:
    pipe = sdkit.load_pipeline(ROOT / "sd15", backend="reference")
    yield pipe
    pipe.close()


@pytest.fixture(scope="module")
def sd15_inpaint() -> Any:
    pipe = sdkit.load_pipeline(ROOT / "sd15_inpaint", backend="reference")
    yield pipe
    pipe.close()


REQUEST = {"steps": 2, "seed": 5, "guidance_scale": 7.5, "sampler": "euler", "output_type": "np"}


def small_mask() -> np.ndarray:
    mask = np.zeros((32, 48), dtype=np.uint8)
    mask[10:18, 20:30] = 255
    return mask


# -- the request ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"mask": "MASK"}, "a mask needs an init_image"),
        ({"init_image": "INIT", "mask": "HALF"}, "the mask is 24x32 but the init image is 48x32"),
        ({"init_image": "INIT", "mask": "EMPTY"}, "selects nothing to repaint"),
        ({"mask_blur": 4}, "mask_blur is an inpainting option"),
        ({"inpaint_full_res": True}, "inpaint_full_res is an inpainting option"),
        ({"paste_back": True}, "paste_back is an inpainting option"),
        ({"init_image": "INIT", "mask": "MASK", "inpaint_full_res": 1}, "inpaint_full_res must be True or False"),
        ({"init_image": "INIT", "mask": "MASK", "mask_blur": -1}, "mask_blur must be an integer >= 0"),
        ({"init_image": "INIT", "mask": np.zeros((32, 48), np.float32)}, "uint8"),
        ({"init_image": "INIT", "mask": "/no/mask.png"}, "mask not found"),
        ({"init_image": "INIT", "mask": "MASK", "inpaint_full_res": True, "control": [("SMALL", "a")]}, "cropped"),
    ],
)
def test_bad_inpainting_requests_are_refused_without_a_model(
    fields: dict[str, Any], match: str, images: dict[str, np.ndarray]
) -> None:
    named = {
        "INIT": images["init_image"],
        "MASK": images["mask_image"],
        "HALF": images["mask_image"][:, :24].copy(),
        "EMPTY": np.full((32, 48), 127, np.uint8),  # 127 < 128: nothing is repainted
        "SMALL": images["init_image"][:16, :24].copy(),
    }
    values = {k: named.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
    if "control" in values:
        values["control"] = [(named[i], m) for i, m in values["control"]]
    with pytest.raises(InputError, match=match):
        GenerationRequest.create("x", **values)


def test_mask_inputs(tmp_path: Path, images: dict[str, np.ndarray]) -> None:
    grey = images["mask_image"]
    Image.fromarray(grey).save(tmp_path / "mask.png")
    rgb = np.repeat(grey[..., None], 3, axis=2)
    for value in (grey, tmp_path / "mask.png", Image.fromarray(grey), rgb, Image.fromarray(rgb).convert("RGBA")):
        np.testing.assert_array_equal(open_mask(value), grey)
    np.testing.assert_array_equal(open_mask(grey >= 128), np.where(grey >= 128, 255, 0))


# -- the model ------------------------------------------------------------------------------------


def test_an_inpainting_model_needs_a_mask(sd15_inpaint: Any, images: dict[str, np.ndarray]) -> None:
    with pytest.raises(InputError, match="is an inpainting model"):
        sd15_inpaint.generate("x", **REQUEST)
    with pytest.raises(InputError, match="is an inpainting model"):
        sd15_inpaint.generate("x", init_image=images["init_image"], **REQUEST)


def test_a_mask_needs_a_vae_encoder(tmp_path: Path, images: dict[str, np.ndarray]) -> None:
    import shutil

    copy = tmp_path / "sd15"
    shutil.copytree(ROOT / "sd15", copy, ignore=shutil.ignore_patterns("vae_encoder", "unet_controlnet"))
    pipe = sdkit.load_pipeline(copy, backend="reference", prepare=False)
    with pytest.raises(ModelFormatError, match="vae_encoder"):
        pipe.generate("x", init_image=images["init_image"], mask=images["mask_image"], **REQUEST)


@pytest.mark.parametrize("folder", ["sd15", "sd15_inpaint"])
def test_image_i_of_a_batch_is_seed_plus_i(
    folder: str, request: pytest.FixtureRequest, images: dict[str, np.ndarray]
) -> None:
    pipe = request.getfixturevalue(folder)
    kwargs = {**REQUEST, "init_image": images["init_image"], "mask": images["mask_image"], "strength": 0.75}
    batch = pipe.generate("x", **{**kwargs, "num_images": 2})
    second = pipe.generate("x", **{**kwargs, "seed": REQUEST["seed"] + 1})
    assert float(np.abs(batch[1] - second[0]).max()) <= 1e-5


def overlay(generated: np.ndarray, original: Image.Image, mask: Image.Image, region: Any = None) -> np.ndarray:
    """diffusers' ``VaeImageProcessor.apply_overlay`` (A1111's ``apply_overlay`` does the same):
    the original with alpha = 255 - mask composited over the generated image, pasted at
    ``region`` first when given. PIL, uint8: the independent oracle."""
    image = Image.fromarray(np.round(generated * 255).astype(np.uint8))
    masked = Image.new("RGBa", original.size)
    masked.paste(original.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(mask.convert("L")))
    masked = masked.convert("RGBA")
    if region is not None:
        x1, y1, x2, y2 = region
        base = Image.new("RGBA", original.size)
        base.paste(image.resize((x2 - x1, y2 - y1), Image.Resampling.LANCZOS), (x1, y1))
        image = base.convert("RGB")
    image = image.convert("RGBA")
    image.alpha_composite(masked)
    return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


def test_paste_back_is_a1111s_overlay(sd15: Any, images: dict[str, np.ndarray]) -> None:
    init, mask = images["init_image"], small_mask()
    kwargs = {**REQUEST, "init_image": init, "mask": mask, "mask_blur": 2}
    plain = sd15.generate("x", **kwargs)
    pasted = sd15.generate("x", **kwargs, paste_back=True)
    blurred = blur_mask(mask, 2)
    doubled = Image.fromarray(np.minimum(blurred.astype(np.int32) * 2, 255).astype(np.uint8))  # A1111's overlay mask
    expected = overlay(plain[0], Image.fromarray(init), doubled)
    assert float(np.abs(pasted[0] - expected).max()) <= 2 / 255
    outside = np.asarray(doubled) == 0
    np.testing.assert_allclose(pasted[0][outside], init[outside] / 255.0, atol=1e-6)
    assert float(np.abs(plain[0][outside] - init[outside] / 255.0).max()) > 0.05  # the VAE round trip


def test_only_masked_generates_the_crop_and_pastes_it_back(sd15: Any, images: dict[str, np.ndarray]) -> None:
    """``inpaint_full_res``: A1111's crop region (``sdkit.pipelines.imaging.masks``, tested against its
    worked example), the crop inpainted at the generation size as an ordinary request, and the
    paste into the original as diffusers' ``apply_overlay(..., crop_coords)`` does it."""
    init, mask = images["init_image"], small_mask()
    padding = 4
    kwargs = {**REQUEST, "init_image": init, "mask": mask, "inpaint_full_res_padding": padding}
    full = sd15.generate("x", **kwargs, inpaint_full_res=True)
    region = expand_crop_region(crop_region(mask, padding), 48, 32, 48, 32)
    # box (20, 10, 30, 18) + 4 -> (16, 6, 34, 22), 18 x 16, widened by int(16 * 1.5 - 18) = 6 to 3:2
    assert region == (13, 6, 37, 22)
    crop = Image.fromarray(init).crop(region).resize((48, 32), Image.Resampling.LANCZOS)
    crop_mask = Image.fromarray(mask).crop(region).resize((48, 32), Image.Resampling.LANCZOS)
    inner = sd15.generate("x", **REQUEST, init_image=np.asarray(crop), mask=np.asarray(crop_mask))
    expected = overlay(inner[0], Image.fromarray(init), Image.fromarray(mask), region)
    assert full.shape == (1, 32, 48, 3)
    assert float(np.abs(full[0] - expected).max()) <= 2 / 255
    x1, y1, x2, y2 = region
    outside = np.ones((32, 48), bool)
    outside[y1:y2, x1:x2] = False
    np.testing.assert_allclose(full[0][outside], init[outside] / 255.0, atol=1e-6)


def test_only_masked_keeps_the_original_size(sd15: Any, images: dict[str, np.ndarray]) -> None:
    """Generated at 32 x 32 (the processing size), delivered at the init image's 48 x 32."""
    kwargs = {**REQUEST, "output_type": "pil", "width": 32, "height": 32}
    out = sd15.generate("x", **kwargs, init_image=images["init_image"], mask=small_mask(), inpaint_full_res=True)
    assert out[0].size == (48, 32)
    assert "Size: 32x32" in out[0].info["parameters"]


# -- A1111's masked content (inpainting_fill) ----------------------------------------------------


def test_fill_masked_keeps_the_rest_and_fills_from_it() -> None:
    """A1111's "fill": unmasked pixels kept exactly; the masked ones come from the rest only (an
    image whose unmasked part is one colour is filled with that colour, whatever was under the
    mask)."""
    from sdkit.pipelines.features.inpainting import fill_masked

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)
    mask = Image.fromarray(small_mask())
    filled = np.asarray(fill_masked(Image.fromarray(pixels), mask))
    keep = small_mask() == 0
    np.testing.assert_array_equal(filled[keep], pixels[keep])
    assert not np.array_equal(filled[~keep], pixels[~keep])
    flat = np.full((32, 48, 3), (200, 40, 90), dtype=np.uint8)
    flat[~keep] = pixels[~keep]  # noise under the mask: it must not leak into the fill
    # up to 3 levels off: 8-bit premultiplied alpha rounds where the blurred alpha is small
    assert int(np.abs(np.asarray(fill_masked(Image.fromarray(flat), mask), np.int16) - flat[0, 0]).max()) <= 3


def test_fill_latents_as_a1111() -> None:
    from sdkit.pipelines.features.inpainting import fill_latents
    from sdkit.pipelines.stages.rng import NoiseStream

    latents = np.random.default_rng(1).standard_normal((1, 4, 4, 6)).astype(np.float32)
    mask = np.zeros((1, 1, 4, 6), np.float32)
    mask[..., 1:3, 2:5] = 1
    repaint = np.broadcast_to(mask, latents.shape) == 1
    nothing = fill_latents(latents, mask, 3, NoiseStream([7]))
    assert (nothing[repaint] == 0).all() and np.array_equal(nothing[~repaint], latents[~repaint])
    noised = fill_latents(latents, mask, 2, NoiseStream([7]))
    drawn = NoiseStream([7]).normal(latents.shape)
    assert np.array_equal(noised[repaint], drawn[repaint]) and np.array_equal(noised[~repaint], latents[~repaint])
    assert fill_latents(latents, mask, 1, NoiseStream([7])) is latents


def test_inpainting_fill_in_generate(sd15: Any, images: dict[str, np.ndarray]) -> None:
    """1 (original) is the default's image bit for bit; each other mode changes the repainted
    part only (the paste-back keeps the original outside the blurred mask)."""
    init, mask = images["init_image"], small_mask()
    kwargs = {**REQUEST, "init_image": init, "mask": mask, "mask_blur": 2, "paste_back": True, "strength": 0.6}
    original = sd15.generate("x", **kwargs)
    assert np.array_equal(sd15.generate("x", **kwargs, inpainting_fill=1), original)
    outside = blur_mask(mask, 2) == 0
    for fill in (0, 2, 3):
        image = sd15.generate("x", **kwargs, inpainting_fill=fill)
        np.testing.assert_allclose(image[0][outside], init[outside] / 255.0, atol=1e-6)
        assert float(np.abs(image[0][~outside] - original[0][~outside]).max()) > 1e-3, fill
    with pytest.raises(InputError, match="inpainting_fill is an inpainting option"):
        GenerationRequest.create("x", inpainting_fill=0)
    with pytest.raises(InputError, match="inpainting_fill must be 0"):
        GenerationRequest.create("x", init_image=init, mask=mask, inpainting_fill=4)
