"""The engine behind the HTTP API: one loaded pipeline, its job queue, and the work each job does.

Every pipeline call (generation, model switch) runs on the queue's worker thread, so a pipeline
is only ever used by one thread and a model switch waits for the generation before it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdkit.errors import InputError, ModelFormatError, SdkitError
from sdkit.files import inside
from sdkit_serve.a1111 import GenerationPlan
from sdkit_serve.catalog import Checkpoint, ModelCatalog
from sdkit_serve.config import ServerConfig
from sdkit_serve.extra_networks import Folders, controlnet_folders, list_loras, load_embeddings
from sdkit_serve.faces import FaceSettings
from sdkit_serve.images import encode_png
from sdkit_serve.jobs import Job, JobCancelled, JobQueue
from sdkit_serve.model_choice import ModelChoice, ModelRequest
from sdkit_serve.preview import PreviewDecoder

log = logging.getLogger("sdkit_serve")

# The A1111 options this server keeps (GET /sdapi/v1/options); sd_model_checkpoint and sd_vae
# are the selection, the others what /internal/progress reads.
DEFAULT_OPTIONS: dict[str, Any] = {"live_previews_enable": True, "live_previews_image_format": "png"}


@dataclass
class GenerationResult:
    images: list[str]  # base64 PNGs
    parameters: list[Any]  # sdkit GenerationParameters, one per image made
    model: str
    model_hash: str | None = None
    interrupted: bool = False
    seconds: float = 0.0
    backends: dict[str, str | None] = field(default_factory=dict)


class Engine:
    """One model instance: the catalogue of models it offers (``--model``, ``--ckpt-dir``,
    ``--vae-dir``), the selected one, the loaded pipeline, and its queue."""

    def __init__(self, config: ServerConfig) -> None:
        from sdkit.cache import cache_root

        self.config = config
        self.catalog = ModelCatalog(
            config.models, config.ckpt_dir, config.vae_dir, cache_root() / "serve" / "model-hashes.json"
        )
        if not self.catalog.checkpoints:
            raise InputError(f"no model found in {config.ckpt_dir} (.safetensors files or pipeline folders)")
        self.selected = ModelChoice(next(iter(self.catalog.checkpoints)))
        self.loaded: Checkpoint | None = None  # what self.pipeline holds
        self.loaded_vae: Path | None = None  # the VAE file set on it (None: the checkpoint's own)
        self.pipeline: Any = None
        self.refiner: tuple[str, Any] | None = None  # (catalogue name, pipeline)
        # how the last model switch went: component -> "refit" / "recompile", or {"pipeline": "loaded"}
        self.last_switch: dict[str, str] = {}
        self.options: dict[str, Any] = dict(DEFAULT_OPTIONS)
        self.embeddings: dict[str, dict[str, Any]] = {"loaded": {}, "skipped": {}}  # A1111's answer
        self._loras: list[tuple[Path, float]] = []  # set on the pipeline now
        self._controlnets: dict[str, Path] = {}
        self.queue = JobQueue(config.queue_size)
        self.preview: PreviewDecoder | None = None
        # Tells Ray Serve replicas apart in `info`; random rather than host:pid, so a public server
        # does not tell its clients its host name.
        self.worker = uuid.uuid4().hex[:12]

    def start(self) -> Engine:
        """Load the first model and the preview decoder now, so a bad path fails at startup.
        The first model is the first ``--model``; without one, the first file of ``--ckpt-dir``
        that loads (the others are logged, and refused when selected)."""
        candidates = [self.selected.checkpoint] if self.config.models else list(self.catalog.checkpoints)
        for name in candidates:
            try:
                self.use(ModelChoice(name))
            except SdkitError as exc:
                if name == candidates[-1]:
                    raise
                log.warning("cannot load %s, trying the next model: %s", name, exc)
            else:
                self.selected = ModelChoice(name)
                break
        if self.config.preview_decoder is not None:
            # Per-component choices name pipeline components; the preview decoder is none of them.
            backend = self.config.backend if isinstance(self.config.backend, str) else "auto"
            device = self.config.device if isinstance(self.config.device, str) else None
            self.preview = PreviewDecoder(self.config.preview_decoder, backend, device, **self.config.options)
        return self

    def close(self) -> None:
        self.queue.close()
        for pipe in (self.pipeline, self.refiner[1] if self.refiner else None):
            if pipe is not None:
                pipe.close()
        self.pipeline, self.refiner = None, None

    @property
    def model(self) -> str:
        """The selected model's title (``sd_model_checkpoint`` as A1111 reports it)."""
        return self.selected_checkpoint().title

    def selected_checkpoint(self) -> Checkpoint:
        return self.checkpoint(self.selected.checkpoint)

    def checkpoint(self, name: str) -> Checkpoint:
        """The catalogue's entry for ``name``; the loaded model keeps serving under its name
        after a refresh no longer lists its file (as in A1111, until another is chosen)."""
        found = self.catalog.checkpoints.get(name)
        if found is None and self.loaded is not None and self.loaded.name == name and self.pipeline is not None:
            return self.loaded
        return found or self.catalog.find(name)

    def _load_pipeline(self, path: Path) -> Any:
        import sdkit

        log.info("loading %s", path)
        return sdkit.load_pipeline(
            path,
            backend=self.config.backend,
            device=self.config.device,
            memory=self.config.memory,
            **served_options(self.config.options),
        )

    # -- models, VAEs, refiners (on the queue's thread) ----------------------------------

    def use(self, choice: ModelChoice) -> Any:
        """The pipeline for ``choice``, switching model and VAE if it holds others. A model
        that fails to load leaves the current one loaded and serving."""
        checkpoint = self.checkpoint(choice.checkpoint)
        if self.pipeline is None or self.loaded is None or self.loaded.path != checkpoint.path:
            self._switch(checkpoint)
        vae = self.catalog.vae(choice.vae, checkpoint)
        wanted = None if vae is None else inside(vae.root, vae.path.relative_to(vae.root), "VAE")
        if wanted != self.loaded_vae:
            if self.pipeline.checkpoint is None:
                raise InputError(
                    f"{checkpoint.name} is a pipeline folder of ONNX graphs: a VAE file cannot replace its VAE "
                    f"(sd_vae {choice.vae!r}); use a .safetensors checkpoint, or sd_vae 'None'"
                )
            self.pipeline.set_vae(wanted)  # opens and checks the file before changing anything
            self.loaded_vae = wanted
        return self.pipeline

    def _switch(self, checkpoint: Checkpoint) -> None:
        path = checkpoint.checked_path()
        current = self.pipeline
        if current is not None and current.checkpoint is not None and path.is_file():
            try:  # refit the compiled components with the new weights where the backend can
                swaps = current.set_checkpoint(path)
            except (ModelFormatError, InputError) as exc:
                # raised before anything changed: another family, or a file that is no checkpoint
                log.info("%s cannot take %s's weights (%s): loading it anew", self.loaded, path.name, exc)
            except BaseException:
                self.pipeline, self.loaded, self.loaded_vae = None, None, None  # half-switched: reload next time
                current.close()
                raise
            else:
                log.info("switched to %s: %s", checkpoint.name, swaps)
                self.loaded, self.last_switch = self.catalog.hashed(checkpoint), dict(swaps)
                return
        new = self._load_pipeline(path)  # load first: a failure leaves `current` serving
        embeddings = load_embeddings(new, self.config.embeddings_dir)
        self.pipeline, self.loaded, self.loaded_vae = new, self.catalog.hashed(checkpoint), None
        # a new pipeline holds no LoRAs or ControlNets yet (a refit above keeps them, merged on the
        # new weights, as it keeps the embeddings)
        self._loras, self._controlnets, self.embeddings = [], {}, embeddings
        self.last_switch = {"pipeline": "loaded"}
        if current is not None:
            current.close()

    def refiner_pipeline(self, name: str) -> Any:
        """The refiner named ``name`` (kept loaded for the next request that asks for it)."""
        if self.refiner is not None and self.refiner[0] == name:
            return self.refiner[1]
        checkpoint = self.catalog.find(name)
        new = self._load_pipeline(checkpoint.checked_path())
        old, self.refiner = self.refiner, (name, new)
        if old is not None:
            old[1].close()
        return new

    def lora_files(self) -> dict[str, Path]:
        """LoRA name -> file in ``--lora-dir`` (none without one), read afresh on each call
        (``/sdapi/v1/refresh-loras`` has nothing to cache)."""
        return list_loras(self.config.lora_dir)

    @property
    def folders(self) -> Folders:
        return Folders(self.config.lora_dir, self.config.controlnet_dir)

    @property
    def face_settings(self) -> FaceSettings:
        """The face folder and A1111's settings: POST /options' values, else the server's flags."""
        config, options = self.config, self.options
        model = options.get("face_restoration_model", config.face_restoration_model)
        return FaceSettings(config.face_dir, model, float(options.get("code_former_weight", config.code_former_weight)))

    def controlnets(self) -> dict[str, Path]:
        return controlnet_folders(self.config.controlnet_dir)

    def _use_adapters(self, plan: GenerationPlan) -> None:
        """Set the plan's LoRAs and load its ControlNets, where they differ from the pipeline's
        now (a request without LoRAs after one with them gets the base weights back). Both calls
        change nothing when they fail (a LoRA of another family, a ControlNet that does not load)."""
        if plan.loras != self._loras:
            self.pipeline.set_loras(plan.loras)
            self._loras = list(plan.loras)
        if plan.controlnets and any(self._controlnets.get(n) != p for n, p in plan.controlnets.items()):
            wanted = {**self._controlnets, **plan.controlnets}
            self.pipeline.set_controlnets(wanted)
            self._controlnets = wanted

    # -- work run on the queue's thread -----------------------------------------------------

    def generate(self, plan: GenerationPlan, job: Job, models: ModelRequest | None = None) -> GenerationResult:
        """Run ``plan`` batch by batch on the model ``models`` names (default: the one selected
        now); ``/interrupt`` keeps the finished batches (as A1111)."""
        start = time.perf_counter()
        models = models or ModelRequest(self.selected)
        job.check()
        pipe = self.use(models.choice)
        extra = self._refiner_arguments(pipe, models)
        if models.persist:
            self.selected = models.choice
        images: list[Any] = []
        job.batch_count = plan.n_iter
        self._use_adapters(plan)
        interrupted = False
        for iteration in range(plan.n_iter):
            job.batch_no, job.step = iteration, 0
            try:
                job.check()
                batch = pipe.generate(
                    **plan.generate,
                    seed=plan.first_seed(iteration),
                    num_images=plan.batch_size,
                    callback=job.on_step,
                    **extra,
                )
            except JobCancelled:
                if job.cancel_reason != "interrupted":
                    raise  # the client left or the server stops: nobody wants the images
                interrupted = True
                break
            images.extend(batch)
        encoded = [encode_png(im, im.info.get("parameters")) for im in images] if plan.send_images else []
        return GenerationResult(
            images=encoded,
            parameters=[im.info["sdkit_parameters"] for im in images],
            model=self.loaded.stem if self.loaded else "",  # A1111: the file name without extension
            model_hash=self.loaded.shorthash if self.loaded else None,
            interrupted=interrupted,
            seconds=time.perf_counter() - start,
            backends=pipe.backends(),
        )

    def _refiner_arguments(self, pipe: Any, models: ModelRequest) -> dict[str, Any]:
        if models.refiner is None:
            return {}
        from sdkit.pipelines.features.feature import Feature

        if Feature.REFINER not in type(pipe).features:
            raise InputError(f"refiner_checkpoint needs an SDXL base model; {models.choice.checkpoint} is not one")
        return {"refiner": self.refiner_pipeline(models.refiner), "refiner_switch_at": models.refiner_switch_at}

    def switch(self, choice: ModelChoice, job: Job) -> str:
        """Load ``choice`` and make it the selection (``POST /sdapi/v1/options``)."""
        job.check()
        self.use(choice)
        self.selected = choice
        return self.model


def served_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The compile options a server uses: isolation on (a backend's native crash in a compile
    or first run must not take the server down) unless the options or SDKIT_ISOLATE say."""
    served = dict(options)
    if "isolate" not in served and not os.environ.get("SDKIT_ISOLATE", "").strip():
        served["isolate"] = True
    return served
