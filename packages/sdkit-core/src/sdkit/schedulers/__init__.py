"""Diffusion schedulers (samplers), numpy only, registered as plugins.

    from sdkit.schedulers import create_scheduler, noise_from_seed
    sched = create_scheduler("DPM++ 2M Karras", config=scheduler_config)
    sched.set_timesteps(25)
    latents = noise * sched.init_noise_sigma
    for t in sched.timesteps:
        out = unet(sched.scale_model_input(latents, t), t)
        latents = sched.step(out, t, latents, noise=draw)

TABLE_PLACEHOLDER
"""

from __future__ import annotations

from sdkit.schedulers.base import SCHEDULES, NoiseFn, Scheduler, SchedulerConfig, noise_from_seed
from sdkit.schedulers.names import create_scheduler, resolve, resolve_schedule, scheduler_class, scheduler_names

__all__ = [
    "SCHEDULES",
    "NoiseFn",
    "Scheduler",
    "SchedulerConfig",
    "create_scheduler",
    "noise_from_seed",
    "resolve",
    "resolve_schedule",
    "scheduler_class",
    "scheduler_names",
]
