"""Diffusion schedulers (samplers), numpy only, registered as plugins.

    from sdkit.schedulers import create_scheduler, noise_from_seed
    sched = create_scheduler("DPM++ 2M Karras", config=scheduler_config)
    sched.set_timesteps(25)
    latents = noise * sched.init_noise_sigma
    for t in sched.timesteps:
        out = unet(sched.scale_model_input(latents, t), t)
        latents = sched.step(out, t, latents, noise=draw)   # draw = noise_from_seed(seed)

Samplers (``scheduler_names()``; any alias resolves, ignoring case, spaces, "-" and "++"
vs "pp", plus A1111's "k_" prefix; third-party plugins add theirs through
``sdkit_register_schedulers``):

=============  =========================================  ========================================================
name           aliases (A1111 / ComfyUI / diffusers)      checked against (diffusers 0.42.1)
=============  =========================================  ========================================================
euler          Euler, k_euler, euler_discrete             EulerDiscreteScheduler
euler_a        Euler a, euler_ancestral, k_euler_a,       EulerAncestralDiscreteScheduler (it has no Karras or
               k_euler_ancestral, euler_ancestral_discrete  exponential option: those use EulerDiscreteScheduler's
                                                          sigmas and timesteps, copied into it for the check)
heun           Heun, k_heun, heun_discrete                HeunDiscreteScheduler
dpmpp_2m       DPM++ 2M, k_dpmpp_2m, dpmsolver++,         DPMSolverMultistepScheduler(algorithm_type="dpmsolver++",
               dpm_solver_multistep                       solver_order=2)
dpmpp_2m_sde   DPM++ 2M SDE, k_dpmpp_2m_sde,              DPMSolverMultistepScheduler(
               sde-dpmsolver++                            algorithm_type="sde-dpmsolver++", solver_order=2)
dpmpp_sde      DPM++ SDE, k_dpmpp_sde, dpm_solver_sde     DPMSolverSDEScheduler (Brownian-tree noise built from
                                                          the noise callable: see sdkit.schedulers.dpm_sde)
ddim           DDIM                                       DDIMScheduler, any eta (schedules: normal, sgm_uniform)
lcm            LCM                                        LCMScheduler (schedule: normal only, LCM's own)
ddim_sigmas    "DDIM Karras", ddim + any other schedule   ComfyUI's ddim = k-diffusion sample_euler (no eta)
lcm_sigmas     "LCM Karras", lcm + any other schedule     ComfyUI's sample_lcm (see k_solvers.LCMSigmas)
euler_flow     flow_match_euler, FlowMatchEulerDiscrete   FlowMatchEulerDiscreteScheduler (flow matching: SD3,
               (label "Euler"; "Euler" on a flow model)   Flux, Chroma; shift, dynamic shift mu; every schedule:
                                                          see sdkit.schedulers.flow_match)
dpm_2          DPM2, dpm2, k_dpm_2, KDPM2Discrete         k-diffusion sample_dpm_2; KDPM2DiscreteScheduler
dpm_2_a        DPM2 a, dpm_2_ancestral, k_dpm_2_a         k-diffusion sample_dpm_2_ancestral;
                                                          KDPM2AncestralDiscreteScheduler
dpmpp_2s_a     DPM++ 2S a, dpmpp_2s_ancestral             k-diffusion sample_dpmpp_2s_ancestral
dpmpp_3m_sde   DPM++ 3M SDE, k_dpmpp_3m_sde               k-diffusion sample_dpmpp_3m_sde
lms            LMS, k_lms, LMSDiscrete                    k-diffusion sample_lms; LMSDiscreteScheduler
ddpm           DDPM                                       ComfyUI's sample_ddpm; DDPMScheduler
heunpp2        Heun++ 2                                   ComfyUI's sample_heunpp2 (see k_algorithms)
euler_cfg_pp   Euler CFG++                                ComfyUI's sample_euler_cfg_pp (takes ``uncond=``)
dpmpp_2m_cfg_  DPM++ 2M CFG++                             ComfyUI's sample_dpmpp_2m_cfg_pp (takes ``uncond=``)
pp
restart        Restart                                    A1111's restart_sampler (from 20 steps: Karras sigmas
                                                          plus restart segments, more calls than steps)
uni_pc         UniPC, unipc, uni_pc_bh1                   UniPCMultistepScheduler(solver_type="bh1"), option
                                                          order 1..3 (default 3); sdkit.schedulers.unipc
uni_pc_bh2     UniPC bh2, unipc_bh2                       UniPCMultistepScheduler(solver_type="bh2")
deis           DEIS                                       DEISMultistepScheduler (log-rho), option order (3)
ipndm          iPNDM                                      IPNDMScheduler fed the same sigmas; ComfyUI's ipndm
ipndm_v        iPNDM_v                                    ComfyUI's ipndm_v, written down in sdkit.schedulers.ipndm
tcd            TCD                                        TCDScheduler, option eta (gamma, default 0.3)
*_flow         uni_pc_flow, uni_pc_bh2_flow, deis_flow,   the flow variants ("UniPC" on a flow model): diffusers'
               ipndm_flow, ipndm_v_flow                   use_flow_sigmas UniPC / DEIS on FlowMatchEuler's sigmas
=============  =========================================  ========================================================

The last ten (``sdkit.schedulers.k_solvers``) list every model call in ``timesteps`` (DPM2: two
per step) and start img2img at a step, on the tail of the sigmas, as A1111 and ComfyUI do. Flow
variants, as ComfyUI runs them on SD3/Flux/Chroma: ``euler_a_flow``, ``heun_flow``,
``dpmpp_2m_flow``, ``dpmpp_2s_a_flow``, ``lms_flow``, ``dpm_2_flow``, ``dpm_2_a_flow``,
``heunpp2_flow``, ``euler_cfg_pp_flow`` (the ancestral ones are ComfyUI's rectified-flow variants),
``dpmpp_2m_sde_flow``, ``dpmpp_3m_sde_flow``, ``dpmpp_sde_flow`` (ComfyUI's half-log-SNR form with its
first-sigma offset, worked example in ``sdkit.schedulers.k_solvers``), ``ddpm_flow``, ``dpmpp_2m_cfg_pp_flow``
(ComfyUI's unchanged on flow sigmas), ``ddim_flow`` (ComfyUI's ddim: Euler; "DDIM" and "DDIM Karras" on
a flow model; eta 0 only), ``lcm_flow`` (ComfyUI's lcm with the flow noise scaling). Refused on flow
models, the error saying why: Restart (ComfyUI's core has none; A1111/Forge's re-noises the
variance-exploding way, no flow form) and TCD (ComfyUI's core has none).


The step to sigma 0 of UniPC and DEIS returns the clean estimate (diffusers' bh1 and DEIS cannot
evaluate it; see sdkit.schedulers.exponential), as iPNDM's does (ComfyUI's).

Flow-matching models (``prediction_type="flow"``, implied by a ``FlowMatch*`` scheduler config)
take the samplers registered for them: ``create_scheduler("Euler", config=flux_config)`` and
``scheduler_class("euler", prediction_type="flow")`` give ``euler_flow`` (a class's
``variant_of``). A sampler without a flow variant is an OptionError naming those that have one.

Each class's ``label`` is what A1111 writes in an image's ``Sampler:`` field
(``sampler_label("euler_a") == "Euler a"``; a class without one is written under its first
alias, else its name); ``schedule_label`` / ``SCHEDULE_LABELS`` give the ``Schedule type:``.

A1111 names with a schedule suffix resolve to both: ``resolve("DPM++ 2M Karras") ==
("dpmpp_2m", "karras")``, ``resolve("DPM++ 2M SDE Exponential")``, ``"Euler SGM Uniform"``.

Schedules (``schedule=``; aliases in brackets):

===========  ===============================================  ============================================
schedule     diffusers equivalent                             A1111 / ComfyUI
===========  ===============================================  ============================================
normal       the config's ``timestep_spacing`` (else the      A1111 "Uniform", ComfyUI "normal" (both
[uniform,    class default: "linspace", DDIM/LCM "leading")   linspace from t=999 to 0; diffusers'
default]                                                      DPMSolverMultistep linspace keeps n of n+1
                                                              points, so its "normal" ends earlier; at
                                                              fractional t diffusers interpolates sigma
                                                              linearly, k-diffusion log sigma)
karras       ``use_karras_sigmas=True`` (rho 7, training      A1111 "Karras", ComfyUI "karras"
             sigma range)
exponential  ``use_exponential_sigmas=True``                  A1111 "Exponential", ComfyUI "exponential"
sgm_uniform  ``timestep_spacing="trailing"`` (diffusers'      ComfyUI "sgm_uniform", A1111 "SGM Uniform"
[sgm,        documented equivalent; ComfyUI's t_i = 999 -     (also what SDXL-Lightning/Turbo expect)
trailing]    999 i/n, trailing's round(1000 - 1000 i/n) - 1)
simple       none (picks training sigmas; see                 ComfyUI "simple", A1111 "Simple"
             ``sdkit.schedulers.table_schedules``)
ddim_uniform none (every N//steps-th training sigma from      ComfyUI "ddim_uniform"
             t=1, reversed)
beta         none (diffusers' ``use_beta_sigmas`` spaces      ComfyUI "beta", A1111 "Beta"
             sigmas, not timesteps: a different formula)
===========  ===============================================  ============================================

align_your_steps  none; A1111's "Align Your Steps" (NVIDIA's SD 1.5 table, log-linear to any
[ays]             step count; ``align_your_steps_sdxl`` / ``_svd`` the SDXL / SVD tables, the SDXL
                  pipeline's choice for "Align Your Steps"): sdkit.schedulers.sigma_schedules
kl_optimal        none; ComfyUI "kl_optimal", A1111 "KL Optimal" (evenly spaced in atan sigma)
linear_quadratic  none; ComfyUI "linear_quadratic" (Mochi's)

The last six are sigma schedules: every sampler but tcd takes them. DDIM and LCM with a schedule
their diffusers classes lack ("DDIM Karras", ComfyUI's ddim + beta, "LCM", schedule="karras")
resolve to ``ddim_sigmas`` / ``lcm_sigmas``, ComfyUI's ddim and lcm on the model's sigmas, as
ComfyUI and A1111 1.9+ run them with a schedule; "normal" (and "sgm_uniform" for DDIM) stay
diffusers' DDIMScheduler / LCMScheduler. Sampler
options (keyword arguments of ``create_scheduler``): ``eta`` for ddim (default 0; noise
as diffusers' ``DDIMScheduler.step(eta=...)``), ``s_noise`` for euler_a, dpmpp_2m_sde and
dpmpp_sde (A1111's "sigma noise", default 1: multiplies the noise each step adds, as
k-diffusion's samplers do).

What diffusers' pipelines change in a scheduler config before using it (StableDiffusionPipeline
forces ``clip_sample=False`` and ``steps_offset=1``, SDXL changes nothing, ...) is
``pipeline_config_fixups(config, sampler, pipeline)``: a pipeline calls it on the model's
``scheduler_config.json`` before ``create_scheduler``.

``config`` is the model's diffusers ``scheduler_config.json`` dict (``None``: Stable
Diffusion 1.x's). Keys it lacks take the diffusers class's defaults, as
``Scheduler.from_config`` would. Honoured: num_train_timesteps, beta_start, beta_end,
beta_schedule (linear, scaled_linear, squaredcos_cap_v2), trained_betas, prediction_type
(epsilon, v_prediction; the ``prediction_type`` argument overrides it), steps_offset,
timestep_spacing, clip_sample(_range), set_alpha_to_one, sigma_min/sigma_max (euler),
original_inference_steps and timestep_scaling (lcm). The sampler name, not the config,
picks the algorithm and the schedule (use_karras_sigmas and the like are ignored);
settings that would change results in unimplemented ways (rescale_betas_zero_snr,
thresholding, log_linear interpolation, non-midpoint DPM solvers...) are an OptionError.

Numerics follow diffusers' float32 computation step by step (float32 sigmas and samples,
libm-rounded scalar exp/log, torch.linspace's rounding), so the golden replay in
``tests/schedulers`` agrees with diffusers to <= 1e-6 (relative above 1); most samplers
are bit-identical.
"""

from __future__ import annotations

from sdkit.schedulers.base import SCHEDULES, NoiseFn, Scheduler, SchedulerConfig, noise_from_seed
from sdkit.schedulers.names import (
    SCHEDULE_LABELS,
    create_scheduler,
    implied_prediction_type,
    resolve,
    resolve_schedule,
    sampler_label,
    schedule_label,
    scheduler_class,
    scheduler_names,
)
from sdkit.schedulers.pipeline_config import PIPELINE_FIXUPS, pipeline_config_fixups

__all__ = [
    "PIPELINE_FIXUPS",
    "SCHEDULES",
    "SCHEDULE_LABELS",
    "NoiseFn",
    "Scheduler",
    "SchedulerConfig",
    "create_scheduler",
    "implied_prediction_type",
    "noise_from_seed",
    "pipeline_config_fixups",
    "resolve",
    "resolve_schedule",
    "sampler_label",
    "schedule_label",
    "scheduler_class",
    "scheduler_names",
]
