"""The schedulers sdkit ships, in the order ``scheduler_names()`` lists them."""

from __future__ import annotations

from sdkit.schedulers.base import Scheduler
from sdkit.schedulers.ddim import DDIM, LCM
from sdkit.schedulers.dpm_sde import DPMPPSDE
from sdkit.schedulers.dpm_solver import DPMPP2M, DPMPP2MSDE
from sdkit.schedulers.k_samplers import Euler, EulerAncestral, Heun

BUILTIN_SCHEDULERS: tuple[type[Scheduler], ...] = (
    Euler,
    EulerAncestral,
    Heun,
    DPMPP2M,
    DPMPP2MSDE,
    DPMPPSDE,
    DDIM,
    LCM,
)
