"""``sdkit generate --model PATH "prompt"``: txt2img / img2img with any registered family's
pipeline: Stable Diffusion 1.x/2.x, SDXL, SD3, Flux or Chroma (``PATH``: a ``.safetensors``
checkpoint, a diffusers folder, or an ONNX pipeline folder; a transformer-only file with its
``--clip_l``/``--clip_g``/``--t5xxl``/``--vae`` files; SDXL: second prompts, micro-conditioning,
``--refiner``; ``sdkit.cli.sdxl_options``).

The PNG carries the generation parameters in a ``parameters`` text chunk, AUTOMATIC1111 style,
so other tools read them back.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sdkit.cli import engine_options, lora_embeddings_vae_options, progress_report
from sdkit.cli.common import add_option_arguments, options_from
from sdkit.cli.inpaint_options import add_inpaint_arguments, control_fields
from sdkit.cli.large_options import add_large_image_arguments, large_image_fields
from sdkit.cli.output_files import OutputFiles, add_output_arguments
from sdkit.cli.restore_faces import add_face_arguments, face_fields
from sdkit.cli.sdxl_options import add_sdxl_arguments, checked_fields, sdxl_fields
from sdkit.errors import InputError
from sdkit.pipelines.loaders.loading import pipeline_class_for
from sdkit.pipelines.models.sdxl_request import XLRequest
from sdkit.pipelines.request import GenerationRequest

DEFAULT_CFG = 7.0  # A1111's, stable-diffusion.cpp's and the HTTP API's (it was 7.5 before issue 33)
HELP = "generate images with a Stable Diffusion, SDXL, SD3, Flux or Chroma pipeline (img2img: --init-image)"


SD_CPP_NOTE = (
    "stable-diffusion.cpp's names work too: -p/--prompt, -n/--negative-prompt, -W/--width, -H/--height, "
    "-s/--seed, --cfg-scale, --sampling-method, --scheduler, --steps, -o/--output, -i/--init-img, --strength"
)
NAMES_EPILOG = "\0sampler names\0"  # replaced by the registry's names when --help is printed


class _HelpWithNames(argparse.HelpFormatter):
    """Lists the registered sampler and schedule names at the end of ``--help``, read only
    then: building the parser imports no scheduler."""

    def _format_text(self, text: str) -> str:
        if text != NAMES_EPILOG:
            return super()._format_text(text)
        from sdkit.schedulers.names import sampler_listing

        return f"{SD_CPP_NOTE}\n\n{sampler_listing()}\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class, parser.epilog = _HelpWithNames, NAMES_EPILOG
    parser.add_argument("prompt", nargs="?", default=None, help="what to draw (or -p/--prompt)")
    parser.add_argument(
        "--prompt", "-p", dest="prompt_option", default=None, help="what to draw (stable-diffusion.cpp)"
    )
    parser.add_argument(
        "--model",
        "-m",
        "--diffusion-model",  # stable-diffusion.cpp's name for a transformer-only file (Flux)
        default=None,
        help="a .safetensors checkpoint (SD 1.x/2.x, SDXL, SD3, FLUX.1, Chroma), a diffusers folder, or a "
        "diffusers/optimum ONNX folder; --diffusion-model (as stable-diffusion.cpp): the same, for a "
        "transformer-only file (FLUX.1, Chroma, SD3) given with the --clip_l, --clip_g, --t5xxl and --vae "
        "files it needs",
    )
    parser.add_argument("--list-samplers", action="store_true", help="print the sampler and schedule names, and exit")
    parser.add_argument(
        "--prediction",
        choices=("epsilon", "eps", "v", "v_prediction"),
        default=None,
        help="what the model predicts, when its files do not say (a SD 2.x-768 checkpoint without its .yaml: v)",
    )
    add_output_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--num-images", type=int, default=1, help="images to make; image i uses seed + i")
    add_inpaint_arguments(parser)
    add_large_image_arguments(parser)
    add_face_arguments(parser)
    parser.add_argument(
        "--max-sequence-length",
        type=int,
        default=None,
        help="SD3, Flux, Chroma: T5 tokens per prompt (default: 256 for SD3, 512 for Flux and Chroma)",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        help="backend for every component, or per component: unet=ggml,text_encoder=reference,default=auto",
    )
    parser.add_argument("--device", default=None, help="device for every component, or per component like --backend")
    parser.add_argument("--memory", choices=("keep", "offload"), default="keep", help="memory policy (default: keep)")
    lora_embeddings_vae_options.add_arguments(parser)
    add_option_arguments(parser)
    add_sdxl_arguments(parser)
    engine_options.add_arguments(parser)
    progress_report.add_arguments(parser)


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The request's basic flags, each also under stable-diffusion.cpp's name."""
    parser.add_argument("--negative", "-n", "--negative-prompt", default="", help="negative prompt")
    parser.add_argument("--steps", type=int, default=20, help="sampling steps (default: %(default)s)")
    parser.add_argument("--seed", "-s", type=int, default=None, help="random seed (default: a random one, printed)")
    parser.add_argument(
        "--sampler",
        "--sampling-method",
        default=None,
        help="sampler name or UI label, listed below and by --list-samplers (default: Euler a; Euler on SD3, Flux "
        "and Chroma)",
    )
    parser.add_argument(
        "--schedule",
        "--scheduler",
        default=None,
        help="sigma schedule, listed below: normal, karras, ... (default: the sampler's)",
    )
    parser.add_argument(
        "--cfg",
        "--cfg-scale",
        type=float,
        default=DEFAULT_CFG,
        help="classifier-free guidance scale (default: %(default)s, as A1111 and stable-diffusion.cpp)",
    )
    for flag, short in (("width", "-W"), ("height", "-H")):
        parser.add_argument(
            f"--{flag}", short, type=int, default=None, help=f"image {flag}, a multiple of 8 (default: the model's)"
        )
    parser.add_argument("--init-image", "-i", "--init-img", default=None, help="img2img: the image to start from")
    parser.add_argument("--strength", type=float, default=0.8, help="img2img denoising strength (default: %(default)s)")


def per_component_argument(text: str | None, flag: str) -> str | dict[str, str] | None:
    """``ggml`` -> ``"ggml"``; ``unet=ggml,default=auto`` -> ``{"unet": "ggml", "default": "auto"}``."""
    if text is None or "=" not in text:
        return text
    mapping: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InputError(f"{flag} expects NAME or COMPONENT=NAME,..., got {text!r}")
        mapping[name.strip()] = value.strip()
    return mapping


def prompt_and_model(args: argparse.Namespace) -> str:
    """The prompt, given as the positional argument or as ``-p`` (then set as ``args.prompt``, which
    the LoRA options read); ``--model`` checked present."""
    positional, option = args.prompt, getattr(args, "prompt_option", None)
    if positional is not None and option is not None:
        raise InputError("give the prompt once: as an argument or with -p/--prompt, not both")
    if args.model is None:
        raise InputError("--model is required (or --list-samplers)")
    prompt = option if option is not None else positional
    if prompt is None:
        raise InputError('a prompt is required: sdkit generate --model PATH "a prompt" (or -p "a prompt")')
    text = str(prompt)
    args.prompt, args.prompt_option = text, None
    return text


def build_request(
    args: argparse.Namespace, callback: Callable[[int, int, np.ndarray], None] | None = None
) -> GenerationRequest:
    """The request the flags describe, checked before any model loads: a typo fails in a second.
    Its class is the model's pipeline's (found from its config files), so SDXL flags on an SD
    model, a refiner that is not SDXL, or a feature the pipeline does not declare, fail here too."""
    prompt = prompt_and_model(args)
    inpainting, _ = control_fields(args)
    pipeline_class = pipeline_class_for(args.model, args.backend or "auto")
    if pipeline_class is not None:
        request_class, extra = pipeline_class.request_class, checked_fields(args, pipeline_class)
    else:  # a loader that cannot tell: the pipeline checks the fields once it is loaded
        extra = {field: value for field, (_, value) in sdxl_fields(args).items() if field != "refiner"}
        request_class = XLRequest if extra or args.refiner else GenerationRequest
    if args.sampler is not None:  # else the pipeline's request default (Euler for flow models)
        extra["sampler"] = args.sampler
    if args.max_sequence_length is not None:  # a flow model's field: refused by the others
        extra["max_sequence_length"] = args.max_sequence_length
    extra.update(engine_options.fields(args, request_class))  # Wan video, PhotoMaker: sd.cpp's
    request = request_class.create(
        prompt,
        **extra,
        prompt_weighting=args.prompt_weighting,
        clip_skip=args.clip_skip,
        negative_prompt=args.negative,
        seed=args.seed,
        width=args.width,
        height=args.height,
        steps=args.steps,
        guidance_scale=args.cfg,
        schedule=args.schedule,
        init_image=args.init_image,
        strength=args.strength,
        num_images=args.num_images,
        callback=callback,
        **inpainting,
        **large_image_fields(args),
        **face_fields(args),
    )
    if pipeline_class is not None:  # a feature the family lacks (--mask on Flux): refused before loading
        pipeline_class.refuse_unsupported(request)
    return request


def run(args: argparse.Namespace) -> int:
    report = progress_report.ProgressReport.for_args(args)
    with report.listening():
        return generate(args, report)


def generate(args: argparse.Namespace, report: progress_report.ProgressReport) -> int:
    import sdkit
    from sdkit.pipelines import save_png

    if args.list_samplers:
        from sdkit.schedulers.names import sampler_listing

        print(sampler_listing())
        return 0
    request = build_request(args, report.callback)
    outputs = OutputFiles(args.output, args.outdir, args.init_image is not None, args.force, request.num_images)
    if engine_options.is_video(request) and args.output is not None:
        engine_options.refuse_existing(Path(args.output), args.force)
    loras = lora_embeddings_vae_options.check(args)
    start = time.perf_counter()
    settings = {
        "backend": per_component_argument(args.backend, "--backend") or "auto",
        "device": per_component_argument(args.device, "--device"),
        "memory": args.memory,
        **options_from(args),
    }
    controlnets = control_fields(args)[1] or None
    files = lora_embeddings_vae_options.component_files(args)
    report.line(f"loading {args.model} ...")
    pipe = sdkit.load_pipeline(
        args.model, prediction=args.prediction, controlnets=controlnets, prepare=False, **settings, **files
    )
    report.line(f"loaded {type(pipe).__name__} ({', '.join(pipe.components)}) in {time.perf_counter() - start:.1f} s")
    refiner = None
    if args.refiner is not None:  # checked to be SDXL by build_request; the same settings
        report.line(f"loading {args.refiner} ...")
        refiner = sdkit.load_pipeline(args.refiner, prepare=False, **settings)
        request = request.replace(refiner=refiner)
    pipe.plan(pipe.accept(request))  # the checks that need the model, before anything compiles
    lora_embeddings_vae_options.apply(pipe, args, loras)  # merged into the weights before they compile: no refit
    for loaded in (pipe, refiner):
        if loaded is not None:
            loaded.prepare()
    images = pipe.run(request)
    report.close()  # the bar's line ends before the result lines
    if engine_options.is_video(request):  # a Wan video's frames: NAME.webp and NAME-frame-000.png...
        path = outputs.path(0, 1, request.seed)
        engine_options.save_video(images, path, int(getattr(request, "fps", 16)), args.force)
        images = []
    for index, image in enumerate(images):
        parameters = image.info["sdkit_parameters"]
        path = outputs.path(index, len(images), parameters.seed)
        save_png(image, path, parameters)
        print(f"saved {path}")
    backends = ", ".join(f"{name}={backend}" for name, backend in pipe.backends().items() if backend)
    print(f"seed {request.seed}; {time.perf_counter() - start:.1f} s; backends: {backends}")
    return 0
