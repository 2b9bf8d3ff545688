"""``sdkit serve --model PATH``: the A1111-compatible HTTP API (a subcommand of ``sdkit``).

Registered in the ``sdkit.cli`` entry-point group; core imports this module to build its parser,
so it imports nothing of the server stack (FastAPI, uvicorn, Ray) until ``run``.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sdkit.cli.common import add_option_arguments, options_from
from sdkit.cli.generate import per_component_argument
from sdkit.known_backends import install_command

if TYPE_CHECKING:
    from sdkit_serve.config import ServerConfig

HELP = "serve models over AUTOMATIC1111's web API (/sdapi/v1/txt2img, img2img, progress...)"
API_KEY_ENV = "SDKIT_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", "-m", action="append", default=[], help="a model file or pipeline folder; repeat to offer several"
    )
    parser.add_argument(
        "--ckpt-dir",
        type=Path,
        default=None,
        help="A1111's models/Stable-diffusion: offer its .safetensors files and pipeline folders (subfolders too)",
    )
    parser.add_argument("--vae-dir", type=Path, default=None, help="A1111's models/VAE: the files sd_vae may name")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=7860, help="port (default: %(default)s, as A1111)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this key (Authorization: Bearer KEY); default: ${API_KEY_ENV} when set and not empty",
    )
    parser.add_argument(
        "--allow-public-without-key",
        action="store_true",
        help="listen on a non-loopback address without --api-key (anyone who reaches it can use it)",
    )
    parser.add_argument("--backend", default="auto", help="backend, or per component: unet=ggml,default=auto")
    parser.add_argument("--device", default=None, help="device, or per component like --backend")
    parser.add_argument("--memory", choices=("keep", "offload"), default="keep", help="memory policy (default: keep)")
    add_option_arguments(parser)
    limits = parser.add_argument_group("request limits")
    limits.add_argument("--queue-size", type=int, default=8, help="requests that may wait (default: %(default)s)")
    limits.add_argument("--max-width", type=int, default=2048, help="largest width (default: %(default)s)")
    limits.add_argument("--max-height", type=int, default=2048, help="largest height (default: %(default)s)")
    limits.add_argument("--max-steps", type=int, default=150, help="most steps (default: %(default)s)")
    limits.add_argument(
        "--max-batch", type=int, default=8, help="most images per request, batch_size * n_iter (default: %(default)s)"
    )
    limits.add_argument("--max-body-mb", type=float, default=64, help="largest request body (default: %(default)s)")
    limits.add_argument(
        "--max-prompt-chars", type=int, default=20_000, help="longest prompt, in characters (default: %(default)s)"
    )
    parser.add_argument("--preview-decoder", type=Path, default=None, help="TAESD-class ONNX decoder for previews")
    parser.add_argument(
        "--lora-dir",
        type=Path,
        default=None,
        help="A1111's models/Lora: where prompts' <lora:name:weight> tags find name.safetensors (sub-folders too)",
    )
    parser.add_argument(
        "--embeddings-dir",
        type=Path,
        default=None,
        help="textual-inversion .safetensors loaded at start, triggered by their file names in prompts",
    )
    parser.add_argument(
        "--controlnet-dir",
        type=Path,
        default=None,
        help="ControlNet folders (model.onnx + config.json) for alwayson_scripts.controlnet units",
    )
    add_face_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    ray = parser.add_argument_group(f"Ray Serve ({install_command('ray')})")
    ray.add_argument("--ray", action="store_true", help="run on Ray Serve, one pipeline per replica")
    ray.add_argument("--ray-address", default=None, help="Ray cluster to join (default: start a local one)")
    ray.add_argument("--replicas", type=int, default=1, help="replicas (fixed; default: %(default)s)")
    ray.add_argument("--min-replicas", type=int, default=None, help="autoscaling lower bound")
    ray.add_argument("--max-replicas", type=int, default=None, help="autoscaling upper bound")
    ray.add_argument("--gpus-per-replica", type=float, default=0, help="GPUs each replica holds (default: 0)")
    ray.add_argument("--cpus-per-replica", type=float, default=1, help="CPUs each replica holds (default: 1)")


def add_face_arguments(parser: argparse.ArgumentParser) -> None:
    """Face restoration: the folder of A1111's files and its two settings (``sdkit_serve.faces``)."""
    parser.add_argument(
        "--face-dir",
        type=Path,
        default=os.environ.get("SDKIT_FACE_DIR") or None,
        help="GFPGANv1.4 / codeformer-v0.1.0 (+ detection_Resnet50_Final, parsing_parsenet) .safetensors for "
        "restore_faces and the Extras' face restoration (default: $SDKIT_FACE_DIR)",
    )
    parser.add_argument(
        "--face-restoration-model",
        choices=("CodeFormer", "GFPGAN"),
        default=None,
        help="A1111's face_restoration_model for restore_faces (default: CodeFormer if its file is there)",
    )
    parser.add_argument(
        "--code-former-weight", type=float, default=0.5, help="A1111's code_former_weight (default: %(default)s)"
    )


def config_from(args: argparse.Namespace) -> ServerConfig:
    from sdkit_serve.config import Limits, ServerConfig

    limits = Limits(
        max_width=args.max_width,
        max_height=args.max_height,
        max_steps=args.max_steps,
        max_batch=args.max_batch,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_prompt_chars=args.max_prompt_chars,
    )
    return ServerConfig(
        models=tuple(Path(m) for m in args.model),
        backend=per_component_argument(args.backend, "--backend") or "auto",
        device=per_component_argument(args.device, "--device"),
        memory=args.memory,
        options=options_from(args),
        limits=limits,
        queue_size=args.queue_size,
        api_key=api_key_from(args),
        preview_decoder=args.preview_decoder,
        lora_dir=args.lora_dir,
        ckpt_dir=args.ckpt_dir,
        vae_dir=args.vae_dir,
        host=args.host,
        embeddings_dir=args.embeddings_dir,
        controlnet_dir=args.controlnet_dir,
        face_dir=Path(args.face_dir) if args.face_dir else None,
        face_restoration_model=args.face_restoration_model,
        code_former_weight=args.code_former_weight,
    )


def api_key_from(args: argparse.Namespace) -> str | None:
    """``--api-key`` as given (an empty one is refused by ``ServerConfig``), else ``$SDKIT_API_KEY``
    unless it is empty (an empty variable is an unset one)."""
    if args.api_key is not None:
        return str(args.api_key)
    return os.environ.get(API_KEY_ENV) or None


def run(args: argparse.Namespace) -> int:
    from sdkit_serve.config import check_bind

    config = config_from(args)
    check_bind(args.host, config.api_key, args.allow_public_without_key)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    if args.ray:
        from sdkit_serve.ray_serve import ReplicaSpec, serve_on_ray

        spec = ReplicaSpec(
            args.replicas, args.min_replicas, args.max_replicas, args.gpus_per_replica, args.cpus_per_replica
        )
        return serve_on_ray(config, spec, args.host, args.port, args.ray_address)
    return serve_locally(config, args.host, args.port, args.log_level)


def serve_locally(config: ServerConfig, host: str, port: int, log_level: str) -> int:
    import uvicorn

    from sdkit_serve.app import create_app
    from sdkit_serve.engine import Engine

    engine = Engine(config).start()
    try:
        uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0
