"""Core's own implementations, registered through the same hooks as third parties.

Registered by ``"module:attr"`` reference: this module sits in the plugins layer, below the
reference backend, the loaders, the schedulers and the pipelines it names, so it must not import
them (see ``LAYERS.md``); the registry imports each reference when it is added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins.registries import BackendRegistry, LoaderRegistry, SchedulerRegistry

BACKENDS = ("sdkit.reference:ReferenceBackend",)
MODEL_LOADERS = (
    "sdkit.loaders:OnnxLoader",
    "sdkit.pipelines.diffusers_folder:DiffusersOnnxLoader",
)
# In the order ``sdkit.schedulers.scheduler_names()`` lists them.
SCHEDULERS = (
    "sdkit.schedulers.k_samplers:Euler",
    "sdkit.schedulers.k_samplers:EulerAncestral",
    "sdkit.schedulers.k_samplers:Heun",
    "sdkit.schedulers.dpm_solver:DPMPP2M",
    "sdkit.schedulers.dpm_solver:DPMPP2MSDE",
    "sdkit.schedulers.dpm_sde:DPMPPSDE",
    "sdkit.schedulers.ddim:DDIM",
    "sdkit.schedulers.ddim:LCM",
    "sdkit.schedulers.flow_match:FlowMatchEuler",
)


@hookimpl
def sdkit_register_backends(registry: BackendRegistry) -> None:
    for reference in BACKENDS:
        registry.add(reference)


@hookimpl
def sdkit_register_model_loaders(registry: LoaderRegistry) -> None:
    for reference in MODEL_LOADERS:
        registry.add(reference)


@hookimpl
def sdkit_register_schedulers(registry: SchedulerRegistry) -> None:
    for reference in SCHEDULERS:
        registry.add(reference)
