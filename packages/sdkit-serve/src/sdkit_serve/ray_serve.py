"""``sdkit serve --ray``: the same FastAPI app on Ray Serve, one compiled pipeline per replica.

Each replica is a Ray actor that builds its own ``Engine`` (loads and compiles the pipeline) and
``create_app(engine)``; Ray's proxy spreads requests over the replicas. Per replica everything
is as without Ray: one generation at a time, the bounded queue (429 when full), limits, API key.
``/progress`` and ``/interrupt`` reach whichever replica Ray routes them to, not every replica.

Placement: ``gpus_per_replica=1`` makes Ray give each replica a GPU of its own (it sets
``CUDA_VISIBLE_DEVICES``, so ``--device cuda:0`` in the replica is that GPU). Fixed
``replicas``, or autoscaling between ``min_replicas`` and ``max_replicas``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sdkit.errors import OptionError
from sdkit.known_backends import install_command
from sdkit_serve.config import ServerConfig

log = logging.getLogger("sdkit_serve")


@dataclass(frozen=True)
class ReplicaSpec:
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0

    def deployment_options(self, queue_size: int) -> dict[str, Any]:
        """``serve.deployment`` keyword arguments for this spec."""
        if self.replicas < 1 or self.gpus_per_replica < 0 or self.cpus_per_replica < 0:
            raise OptionError("replicas must be >= 1, and GPUs/CPUs per replica >= 0")
        options: dict[str, Any] = {
            "ray_actor_options": {"num_gpus": self.gpus_per_replica, "num_cpus": self.cpus_per_replica},
            # Above the app's own queue, so its 429 (not Ray's backpressure) answers a full replica,
            # with room left for /progress and /interrupt.
            "max_ongoing_requests": queue_size + 8,
        }
        if self.min_replicas is None and self.max_replicas is None:
            options["num_replicas"] = self.replicas
            return options
        low = self.min_replicas if self.min_replicas is not None else 1
        high = self.max_replicas if self.max_replicas is not None else max(low, self.replicas)
        if not 0 <= low <= high or high < 1:
            raise OptionError(f"autoscaling needs 0 <= --min-replicas <= --max-replicas, got {low} and {high}")
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": max(low, 1),
            "target_ongoing_requests": 2,  # one running, one waiting: scale up before queues build
        }
        return options


def import_ray() -> tuple[Any, Any]:
    """``(ray, ray.serve)``, typed loosely: Ray's annotations vary between releases."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise OptionError(f"--ray needs Ray Serve: {install_command('ray')}") from None
    return ray, serve


def build_application(config: ServerConfig, spec: ReplicaSpec, name: str = "sdkit") -> Any:
    """A bound Ray Serve application running ``create_app`` in every replica."""
    _, serve = import_ray()

    def build_app() -> Any:  # runs in each replica process: the pipeline is loaded there
        from sdkit_serve.app import create_app
        from sdkit_serve.engine import Engine

        return create_app(Engine(config).start())

    class SdkitReplica:
        """A replica: its state lives in the app ``build_app`` makes."""

    ingress = serve.ingress(build_app)(SdkitReplica)
    return serve.deployment(name=name, **spec.deployment_options(config.queue_size))(ingress).bind()


def serve_on_ray(config: ServerConfig, spec: ReplicaSpec, host: str, port: int, address: str | None) -> int:
    """Start (or join) a Ray cluster, deploy, and block until interrupted."""
    application = build_application(config, spec)
    ray, serve = import_ray()
    ray.init(address=address, include_dashboard=False)
    try:
        serve.start(http_options={"host": host, "port": port})
        log.info("sdkit serve on Ray Serve: http://%s:%d", host, port)
        serve.run(application, name="sdkit", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
