"""Wan video and SDXL PhotoMaker through the plugin's requests: the keywords each field becomes,
every one a parameter of the installed binding's ``generate_video`` / ``generate_image`` /
``StableDiffusion``, and the refusals naming the field (video options on an image model, image
options on a video request, what the loaded Wan model cannot do, PhotoMaker without its file)."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sdcpp_helpers import needs_binding
from sdcpp_keysets import DENOISERS, header_only

from sdkit.errors import InputError, OptionError
from sdkit.pipelines import GenerationRequest, PipelineConfig
from sdkit_sdcpp.context import Context
from sdkit_sdcpp.engine import ContextSettings, ModelFiles
from sdkit_sdcpp.pipeline import SdcppPipeline, SdcppRequest
from sdkit_sdcpp.request_map import photomaker_kwargs
from sdkit_sdcpp.video import SdcppVideoPipeline, SdcppVideoRequest, video_kwargs

FRAME = Image.new("RGB", (64, 64), (40, 80, 120))


def _video(**fields: object) -> SdcppVideoRequest:
    return SdcppVideoRequest.create("a boat", seed=5, steps=4, **fields)


def test_text_to_video_keywords() -> None:
    kwargs = video_kwargs(_video(video_frames=9, guidance_scale=5, flow_shift=3), 64, 48, family="Wan2.x T2V 1.3B")
    assert kwargs == {
        "prompt": "a boat", "negative_prompt": "", "width": 64, "height": 48, "cfg_scale": 5.0,
        "sample_method": "euler", "scheduler": "default", "sample_steps": 4, "seed": 5, "video_frames": 9,
        "flow_shift": 3.0,
    }  # fmt: skip


def test_image_to_video_and_the_high_noise_expert() -> None:
    request = _video(
        init_image=FRAME, end_image=FRAME, high_noise_steps=2, high_noise_guidance_scale=3.5,
        high_noise_sampler="euler_a", moe_boundary=0.9, vae_tiling=True, vae_tile_size=256,
    )  # fmt: skip
    kwargs = video_kwargs(request, 64, 64, family="Wan2.2 I2V 14B", high_noise=True)
    assert kwargs["init_image"].size == (64, 64) and kwargs["end_image"].size == (64, 64)
    assert (kwargs["high_noise_sample_steps"], kwargs["high_noise_cfg_scale"], kwargs["moe_boundary"]) == (2, 3.5, 0.9)
    assert (kwargs["high_noise_sample_method"], kwargs["vae_tile_size"]) == ("euler_a", "32x32")


@pytest.mark.parametrize(
    ("fields", "family", "message"),
    [
        ({"num_images": 2}, "Wan2.x T2V 1.3B", "num_images: an image option"),
        ({"mask": np.full((64, 64), 255, np.uint8), "init_image": FRAME}, "Wan2.2 TI2V 5B", "mask: an image option"),
        ({"enable_hr": True}, "Wan2.x T2V 1.3B", "enable_hr: an image option"),
        ({"init_image": FRAME}, "Wan2.x T2V 14B", "init_image: a Wan2.x T2V 14B model makes video from text"),
        ({"end_image": FRAME}, "Wan2.2 TI2V 5B", "end_image: a Wan2.2 TI2V 5B model takes no last frame"),
        ({"high_noise_steps": 2}, "Wan2.2 I2V 14B", "high_noise_steps: no high-noise expert is loaded"),
        ({"control_frames": [FRAME]}, "Wan2.x T2V 1.3B", "control_frames: a Wan2.x T2V 1.3B model takes no control"),
        ({"latents": np.zeros((1, 16, 8, 8))}, "Wan2.x T2V 1.3B", "latents: stable-diffusion.cpp does not do"),
    ],
)
def test_what_the_video_model_cannot_do_is_refused_by_name(fields: dict, family: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        video_kwargs(_video(**fields), 64, 64, family=family)


def test_frame_counts_are_4k_plus_1() -> None:
    assert _video(video_frames=1).video_frames == 1
    with pytest.raises(InputError, match=r"video_frames: Wan makes 4k \+ 1 frames"):
        _video(video_frames=8)
    with pytest.raises(OptionError, match="unknown generation option 'video_frames'"):
        GenerationRequest.create("x", video_frames=5)  # an image model's request has no video fields


def _pipeline(tmp_path: Path, cls: type[SdcppPipeline], family: str, files: ModelFiles) -> SdcppPipeline:
    return cls(PipelineConfig(name="m", sample_size=8), Context(files, ContextSettings()), family)


def test_the_video_pipeline_plans_before_any_model_loads(tmp_path: Path) -> None:
    pipe = _pipeline(tmp_path, SdcppVideoPipeline, "Wan2.2 I2V 14B", ModelFiles(diffusion_model=Path("w.gguf")))
    assert pipe.request_class is SdcppVideoRequest
    with pytest.raises(OptionError, match="moe_boundary: no high-noise expert"):
        pipe.plan(pipe.accept(_video(moe_boundary=0.8, init_image=FRAME)))
    loaded = ModelFiles(diffusion_model=Path("w.gguf"), high_noise_diffusion_model=Path("h.gguf"))
    pipe = _pipeline(tmp_path, SdcppVideoPipeline, "Wan2.2 I2V 14B", loaded)
    plan = pipe.plan(pipe.accept(_video(moe_boundary=0.8, init_image=FRAME, video_frames=5)))
    assert (plan.width, plan.height) == (64, 64) and not pipe.context.loaded


def _args(model: Path, **flags: object) -> argparse.Namespace:
    from sdkit.cli.generate import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--model", str(model), "--backend", "sdcpp", "-p", "a man img"]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return parser.parse_args(argv)


def test_cli_video_flags_reach_the_request_or_are_refused_naming_the_flag(tmp_path: Path) -> None:
    from sdkit.cli.generate import build_request

    wan = header_only(tmp_path / "wan.safetensors", DENOISERS["Wan2.2 TI2V 5B"])
    request = build_request(_args(wan, video_frames=17, fps=24, flow_shift=5.0))
    assert isinstance(request, SdcppVideoRequest)
    assert (request.video_frames, request.fps, request.flow_shift) == (17, 24, 5.0)
    with pytest.raises(InputError, match=r"--pm-style-strength: .* does not take it"):
        build_request(_args(wan, pm_style_strength=10))
    flux = header_only(tmp_path / "flux.safetensors", DENOISERS["FLUX.1"])
    with pytest.raises(InputError, match=r"--video-frames: .* needs a Wan video model"):
        build_request(_args(flux, video_frames=5))


def test_photomaker_fields(tmp_path: Path) -> None:
    folder = tmp_path / "id"
    folder.mkdir()
    for index in range(2):
        FRAME.save(folder / f"{index}.png")
    request = SdcppRequest.create("a man img, studio", photomaker_images=str(folder), photomaker_style_strength=30)
    assert len(request.photomaker_images) == 2
    kwargs = photomaker_kwargs(request, loaded=True)
    assert kwargs["pm_style_strength"] == 30.0 and [i.size for i in kwargs["pm_id_images"]] == [(64, 64)] * 2
    assert photomaker_kwargs(SdcppRequest.create("a man"), loaded=False) == {}
    with pytest.raises(OptionError, match="photomaker_images: no PhotoMaker is loaded"):
        photomaker_kwargs(request, loaded=False)
    with pytest.raises(OptionError, match="photomaker_images: a PhotoMaker is loaded"):
        photomaker_kwargs(SdcppRequest.create("a man img"), loaded=True)
    with pytest.raises(OptionError, match="prompt: PhotoMaker needs its trigger word"):
        photomaker_kwargs(SdcppRequest.create("a man", photomaker_images=str(folder)), loaded=True)
    with pytest.raises(InputError, match="holds no image files"):
        SdcppRequest.create("a man img", photomaker_images=str(tmp_path / "id" / ".."))


def test_cli_photomaker_flags(tmp_path: Path) -> None:
    from sdkit.cli.generate import build_request

    folder = tmp_path / "id"
    folder.mkdir()
    FRAME.save(folder / "a.png")
    wan = header_only(tmp_path / "wan.safetensors", DENOISERS["Wan2.x T2V 1.3B"])
    with pytest.raises(InputError, match=r"--pm-id-images-dir: .*an SDXL model with --photo-maker"):
        build_request(_args(wan, pm_id_images_dir=folder))


@needs_binding
def test_every_video_and_photomaker_keyword_is_the_bindings() -> None:
    from sdkit_sdcpp import binding

    module = binding.import_binding()
    request = _video(
        init_image=FRAME, end_image=FRAME, flow_shift=3, high_noise_steps=2, high_noise_guidance_scale=3.5,
        high_noise_sampler="euler", high_noise_schedule="karras", moe_boundary=0.9, vae_tiling=True,
        control_frames=[FRAME], vace_strength=0.5,
    )  # fmt: skip
    kwargs = video_kwargs(request, 64, 64, family="Wan2.1 I2V VACE", high_noise=True)
    assert len(kwargs) == 23
    assert set(kwargs) <= set(inspect.signature(module.StableDiffusion.generate_video).parameters)
    photo = SdcppRequest.create("a man img", photomaker_images=[FRAME], photomaker_style_strength=20)
    pm = photomaker_kwargs(photo, loaded=True)
    assert set(pm) == {"pm_id_images", "pm_style_strength"}
    assert set(pm) <= set(inspect.signature(module.StableDiffusion.generate_image).parameters)
    files = ModelFiles(
        diffusion_model=Path("d"), llm=Path("l"), clip_vision=Path("c"), high_noise_diffusion_model=Path("h"),
        photo_maker=Path("p"), t5xxl=Path("t"), vae=Path("v"),
    )  # fmt: skip
    assert set(files.constructor_kwargs()) <= set(inspect.signature(module.StableDiffusion.__init__).parameters)


def test_sdkit_generate_video_writes_webp_and_pngs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sdkit generate --video-frames 5`` end to end but for sd.cpp itself: a double of the
    in-process context's call stands in for ``generate_video`` (it records the method and
    keywords, reports 3 progress steps, returns 5 frames). Checked: the call made, the step bar
    fed, the WebP and PNGs written with the request's parameters."""
    import sdkit
    from sdkit.cli.main import main
    from sdkit.pipelines.imaging.video import read_webp_parameters
    from sdkit_sdcpp.engine import InProcess
    from sdkit_sdcpp.loader import model_files

    wan = header_only(tmp_path / "wan.safetensors", DENOISERS["Wan2.2 TI2V 5B"])
    files = {name: str(tmp_path / f"{name}.gguf") for name in ("t5xxl", "vae")}
    for path in files.values():
        Path(path).write_bytes(b"")
    calls: list[tuple[str, dict]] = []
    frames = [Image.new("RGB", (64, 48), (10 * i, 20, 30)) for i in range(5)]

    def call(self: InProcess, kwargs: dict, progress: object, method: str = "generate_image") -> list[Image.Image]:
        calls.append((method, kwargs))
        for step in range(4):
            progress(step, 3, 0.1)  # type: ignore[operator]
        return [frame.copy() for frame in frames]

    def load(path: str, **options: object) -> SdcppVideoPipeline:
        given = {k: v for k, v in options.items() if k in ("t5xxl", "vae") and v is not None}
        context = Context(model_files(Path(path), given), ContextSettings())
        return SdcppVideoPipeline(PipelineConfig(name="wan", sample_size=8), context, "Wan2.2 TI2V 5B")

    monkeypatch.setattr(InProcess, "call", call)
    monkeypatch.setattr(InProcess, "model", lambda self: None)
    monkeypatch.setattr(SdcppVideoPipeline, "backends", lambda self: {"pipeline": "sdcpp (double)"})
    monkeypatch.setattr(sdkit, "load_pipeline", load)
    out = tmp_path / "boat.png"
    argv = ["generate", "--model", str(wan), "--backend", "sdcpp", "--t5xxl", files["t5xxl"], "--vae", files["vae"]]
    argv += ["-p", "a boat", "-W", "64", "-H", "48", "--steps", "3", "--seed", "9", "--video-frames", "5"]
    assert (
        main([*argv, "--fps", "8", "--cfg", "5", "--flow-shift", "3", "--init-image", _png(tmp_path), "-o", str(out)])
        == 0
    )
    [(method, kwargs)] = calls
    assert method == "generate_video"
    assert {k: kwargs[k] for k in ("video_frames", "sample_steps", "seed", "cfg_scale", "flow_shift", "width")} == {
        "video_frames": 5, "sample_steps": 3, "seed": 9, "cfg_scale": 5.0, "flow_shift": 3.0, "width": 64,
    }  # fmt: skip
    assert kwargs["init_image"].size == (64, 48)
    err = capsys.readouterr().err
    assert "3/3" in err  # the step bar saw sd.cpp's steps
    webp = tmp_path / "boat.webp"
    with Image.open(webp) as video:
        assert video.n_frames == 5
    text = read_webp_parameters(webp) or ""
    assert "Steps: 3" in text and "Seed: 9" in text and "Frames: 5, FPS: 8" in text and "stable-diffusion.cpp" in text
    for index, frame in enumerate(frames):
        with Image.open(tmp_path / f"boat-frame-{index:03d}.png") as png:
            assert np.array_equal(np.asarray(png), np.asarray(frame))
            assert f"Frame: {index + 1}/5, FPS: 8" in png.info["parameters"]
    assert not out.exists()  # -o NAME.png names the video's files; again, it is refused before anything runs
    capsys.readouterr()
    assert main([*argv, "-o", str(out)]) == 1 and len(calls) == 1
    assert "boat.webp exists; pass --force" in capsys.readouterr().err


def _png(tmp_path: Path) -> str:
    path = tmp_path / "first.png"
    Image.new("RGB", (64, 48), (200, 60, 40)).save(path)
    return str(path)
