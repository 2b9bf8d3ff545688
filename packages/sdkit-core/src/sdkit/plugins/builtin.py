"""Core's own implementations, registered through the same hooks as third parties.

Registered by ``"module:attr"`` reference: this module sits in the plugins layer, below the
reference backend, the loaders, the schedulers and the pipelines it names, so it must not import
them (see ``LAYERS.md``); the registry imports each reference when it is added. The model families
(``sdkit.families.builtin``) sit below it, yet go by reference too, like a third party's would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdkit.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from sdkit.plugins.registries import BackendRegistry, FamilyRegistry, LoaderRegistry, SchedulerRegistry

BACKENDS = ("sdkit.reference:ReferenceBackend",)
MODEL_LOADERS = (
    "sdkit.loaders:OnnxLoader",
    "sdkit.pipelines.loaders.diffusers_folder:DiffusersOnnxLoader",
    "sdkit.pipelines.loaders.single_file:CheckpointLoader",
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
    *(
        f"sdkit.schedulers.k_solvers:{name}"
        for name in (
            "DPM2",
            "DPM2Ancestral",
            "DPMPP2SAncestral",
            "DPMPP3MSDE",
            "LMS",
            "DDPM",
            "DDIMSigmas",
            "LCMSigmas",
            "HeunPP2",
            "EulerCFGPP",
            "DPMPP2MCFGPP",
            "Restart",
            "EulerAncestralFlow",
            "HeunFlow",
            "DPMPP2MFlow",
            "DPMPP2SAncestralFlow",
            "LMSFlow",
            "DPM2Flow",
            "DPM2AncestralFlow",
            "HeunPP2Flow",
            "EulerCFGPPFlow",
            "DPMPP2MSDEFlow",
            "DPMPP3MSDEFlow",
            "DDPMFlow",
            "DPMPP2MCFGPPFlow",
            "DPMPPSDEFlow",
            "DDIMFlow",
            "LCMFlow",
        )
    ),
    # issue 27 (UniPC, DEIS, iPNDM, TCD and their flow variants)
    "sdkit.schedulers.unipc:UniPC",
    "sdkit.schedulers.unipc:UniPCBh2",
    "sdkit.schedulers.deis:DEIS",
    "sdkit.schedulers.ipndm:IPNDM",
    "sdkit.schedulers.ipndm:IPNDMV",
    "sdkit.schedulers.tcd:TCD",
    "sdkit.schedulers.unipc:UniPCFlow",
    "sdkit.schedulers.unipc:UniPCBh2Flow",
    "sdkit.schedulers.deis:DEISFlow",
    "sdkit.schedulers.ipndm:IPNDMFlow",
    "sdkit.schedulers.ipndm:IPNDMVFlow",
)
MODEL_FAMILIES = (
    *(
        f"sdkit.families.builtin:{name}"
        for name in ("SD1", "SD1_INPAINT", "SD2", "SD2V", "SDXL", "SDXL_INPAINT", "SDXL_REFINER")
    ),
    "sdkit.families.flux:FLUX_DEV",
    "sdkit.families.flux:FLUX_SCHNELL",
    "sdkit.families.sd3:SD3_MEDIUM",
    "sdkit.families.sd3:SD35_LARGE",
    "sdkit.families.sd3:SD35_MEDIUM",
    "sdkit.families.chroma:CHROMA",
    "sdkit.families.tiny_digits:TINY_DIGITS",
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


@hookimpl
def sdkit_register_model_families(registry: FamilyRegistry) -> None:
    for reference in MODEL_FAMILIES:
        registry.add(reference)
