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

from sdkit.errors import InputError, did_you_mean
from sdkit_serve.a1111 import GenerationPlan
from sdkit_serve.config import ServerConfig, model_name
from sdkit_serve.extra_networks import Folders, controlnet_folders, list_loras, load_embeddings
from sdkit_serve.images import encode_png
from sdkit_serve.jobs import Job, JobCancelled, JobQueue
from sdkit_serve.preview import PreviewDecoder

log = logging.getLogger("sdkit_serve")


@dataclass
class GenerationResult:
    images: list[str]  # base64 PNGs
    parameters: list[Any]  # sdkit GenerationParameters, one per image made
    model: str
    interrupted: bool = False
    seconds: float = 0.0
    backends: dict[str, str | None] = field(default_factory=dict)


class Engine:
    """One model instance: a loaded pipeline (switchable among ``config.models``) and its queue."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.models: dict[str, Path] = {model_name(p): Path(p).absolute() for p in config.models}
        self.model = next(iter(self.models))
        self.pipeline: Any = None
        self.embeddings: dict[str, dict[str, Any]] = {"loaded": {}, "skipped": {}}  # A1111's answer
        self._loras: list[tuple[Path, float]] = []  # set on the pipeline now
        self._controlnets: dict[str, Path] = {}
        self.queue = JobQueue(config.queue_size)
        self.preview: PreviewDecoder | None = None
        # Tells Ray Serve replicas apart in `info`; random rather than host:pid, so a public server
        # does not tell its clients its host name.
        self.worker = uuid.uuid4().hex[:12]

    def start(self) -> Engine:
        """Load the first model and the preview decoder now, so a bad path fails at startup."""
        self._load(self.model)
        if self.config.preview_decoder is not None:
            # Per-component choices name pipeline components; the preview decoder is none of them.
            backend = self.config.backend if isinstance(self.config.backend, str) else "auto"
            device = self.config.device if isinstance(self.config.device, str) else None
            self.preview = PreviewDecoder(self.config.preview_decoder, backend, device, **self.config.options)
        return self

    def close(self) -> None:
        self.queue.close()
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None

    def _load(self, name: str) -> None:
        import sdkit

        if self.pipeline is not None:  # one model in memory at a time
            self.pipeline.close()
            self.pipeline = None
        log.info("loading %s", self.models[name])
        self.pipeline = sdkit.load_pipeline(
            self.models[name],
            backend=self.config.backend,
            device=self.config.device,
            memory=self.config.memory,
            **served_options(self.config.options),
        )
        self.model = name
        self._loras, self._controlnets = [], {}
        self.embeddings = load_embeddings(self.pipeline, self.config.embeddings_dir)

    # -- models and LoRAs ------------------------------------------------------------------

    def resolve_model(self, title: str) -> str:
        """A model name from what a client sends as ``sd_model_checkpoint`` (A1111 titles carry a
        ``[hash]`` suffix and sometimes a file extension)."""
        text = str(title).split(" [")[0].strip()
        for candidate in (text, Path(text).stem, Path(text).name):
            if candidate in self.models:
                return candidate
        raise InputError(f"unknown model {title!r}{did_you_mean(text, self.models)}; models: {', '.join(self.models)}")

    def lora_files(self) -> dict[str, Path]:
        """LoRA name -> file in ``--lora-dir`` (none without one), read afresh on each call
        (``/sdapi/v1/refresh-loras`` has nothing to cache)."""
        return list_loras(self.config.lora_dir)

    @property
    def folders(self) -> Folders:
        return Folders(self.config.lora_dir, self.config.controlnet_dir)

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

    def generate(self, plan: GenerationPlan, job: Job) -> GenerationResult:
        """Run ``plan`` batch by batch; ``/interrupt`` keeps the finished batches (as A1111)."""
        start = time.perf_counter()
        pipe = self.pipeline
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
            model=self.model,
            interrupted=interrupted,
            seconds=time.perf_counter() - start,
            backends=pipe.backends(),
        )

    def switch(self, name: str, job: Job) -> str:
        job.check()
        if name != self.model:
            self._load(name)
        return self.model


def served_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The compile options a server uses: isolation on (a backend's native crash in a compile
    or first run must not take the server down) unless the options or SDKIT_ISOLATE say."""
    served = dict(options)
    if "isolate" not in served and not os.environ.get("SDKIT_ISOLATE", "").strip():
        served["isolate"] = True
    return served
