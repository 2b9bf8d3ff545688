"""The samplers of k-diffusion and ComfyUI beyond Euler/Heun/DPM++, for sigma and flow models.

Each class joins an algorithm of ``sdkit.schedulers.k_algorithms`` (or ``ui_algorithms``) with a model type of
``sdkit.schedulers.k_stepper`` and the names A1111 (its label, also written in PNG parameters),
ComfyUI and diffusers use. The ``*_flow`` classes are the flow-model variants ComfyUI runs on SD3,
Flux and Chroma (``variant_of``: "DPM2" on a flow model is ``dpm_2_flow``).

DPM++ 2M SDE and DPM++ 3M SDE on flow models (``dpmpp_2m_sde_flow``, ``dpmpp_3m_sde_flow``) are
ComfyUI's ``sample_dpmpp_2m_sde`` / ``sample_dpmpp_3m_sde`` with ``CONST`` model sampling: they
work in the half log-SNR lambda = log((1 - sigma) / sigma) (``ui_algorithms.dpmpp_sde_rf`` has the
update), and since lambda(1) = -inf, ComfyUI's ``offset_first_sigma_for_snr`` first replaces a first
sigma >= 1 by the model's ``percent_to_sigma(1e-4)``, the shift of t = 1 - 1e-4:
``shift t / (1 + (shift - 1) t)`` for SD3 (ModelSamplingDiscreteFlow; shift 3: 0.99996666),
``e^mu / (e^mu + 1 / t - 1)`` for Flux / Chroma (ModelSamplingFlux, mu from the resolution as the
schedule's; FLUX.1 dev at 1024x1024, mu 1.15: 0.99996833), in float64 rounded to float32. The first
model call is at that sigma (timestep 999.9667 for SD3), on the initial noise; img2img's tail
(first sigma < 1) is not moved. Worked example (``fixtures/schedulers/make_flow_sde_example.py``,
Python floats; ``flow_sde_example.json``), SD3 shift 3, 4 steps "normal", one-element sample x = 1.5,
x0 estimates D = 0.4, 0.45, 0.5, 0.52 at the four calls, draws z = 1, -0.5, 0.25, s_noise 1:

===================  ==========  ==========  ==========  ==========  =====
                     step 0      step 1      step 2      step 3      end
===================  ==========  ==========  ==========  ==========  =====
sigma                0.99996668  0.85769230  0.60215056  0.00892857  0
lambda               -10.309350  -1.796254   -0.414434   4.709530
h (to next)          8.513096    1.381820    5.123964    (x = D)
x after, 2M SDE      0.914874    0.039121    0.589626    0.52
x after, 3M SDE      0.914874    0.039743    0.715808    0.52
===================  ==========  ==========  ==========  ==========  =====

Step 0 of both: alpha = 1 - 0.85769230, e = 1 - exp(-2 h) = 1 - 4.0e-8, x = (0.85769230 /
0.99996668) exp(-h) 1.5 + alpha e 0.4 + 1 * 0.85769230 sqrt(1 - exp(-2 h)) = 0.914874. Step 1
adds 2M's midpoint term (alpha e / 2) (h / h_prev) (D - D_prev), 3M's alpha phi2 (D - D_prev)
h / h_prev; step 2 uses 3M's two-history term. ``ddpm_flow`` and ``dpmpp_2m_cfg_pp_flow`` are
ComfyUI's ``sample_ddpm`` / ``sample_dpmpp_2m_cfg_pp`` unchanged on flow sigmas (neither has a
``CONST`` form in ComfyUI, and neither offsets the first sigma): images match ComfyUI's, but DDPM's
variance-preserving step is not a posterior of the flow interpolation. ``noise_scale`` (ComfyUI's
per-model multiplier of s_noise) is 1 for SD3, Flux and Chroma and not modelled.

DPM++ SDE on flow models (``dpmpp_sde_flow``) is ComfyUI's ``sample_dpmpp_sde`` in the same half
log-SNR form with the same first-sigma offset (``ui_algorithms.dpmpp_2s_sde_rf``): a midpoint model call
at sigmoid(-(lambda(s) + lambda(s')) / 2) per step, k-diffusion's ancestral split computed between the
variance-exploding sigmas exp(-lambda), and the Brownian tree's increments over flow sigmas (two draws a
step). On the first step that split is ill-conditioned in float32 (VE sigma ~3e4 down to ~10: sigma_down
= sqrt(s'^2 - up^2) cancels), as it is in ComfyUI; sdkit computes it as ComfyUI does with IEEE sqrt
(CUDA's), so a CPU torch run of ComfyUI, whose 0-d sqrt can be 1 ulp off, may differ there by ~1e-3;
in the golden SD3 case the float32 run ends 1.6e-5 (relative) from the same algorithm in float64, which
equals k-diffusion's ``sample_dpmpp_sde`` on the variance-exploding view of the model to 2.3e-16.
``ddim_flow`` is ComfyUI's ddim (k-diffusion's ``sample_euler``; deterministic DDIM is exactly this
step on the flow interpolation) and ``lcm_flow`` ComfyUI's lcm, which re-noises through the model's
``noise_scaling``: ``s' z + (1 - s') x0`` for ``CONST``. Restart has no flow variant (see
``Restart.flow_note``).
"""

from __future__ import annotations

from typing import ClassVar

from sdkit.errors import OptionError
from sdkit.schedulers import k_algorithms as alg
from sdkit.schedulers import ui_algorithms as ui
from sdkit.schedulers.k_stepper import Algorithm, KDiscreteSampler, KFlowSampler

S_NOISE: dict[str, float] = {"s_noise": 1.0}  # A1111's "sigma noise": scales the noise each step adds


class DPM2(KDiscreteSampler):
    name = "dpm_2"
    label = "DPM2"
    aliases: ClassVar[tuple[str, ...]] = ("DPM2", "dpm2", "k_dpm_2", "kdpm2", "KDPM2Discrete")
    order = 2
    algorithm: ClassVar[Algorithm] = alg.dpm_2
    reference = "k_diffusion.sampling.sample_dpm_2"
    diffusers_class = "KDPM2DiscreteScheduler"


class DPM2Ancestral(KDiscreteSampler):
    name = "dpm_2_a"
    label = "DPM2 a"
    aliases: ClassVar[tuple[str, ...]] = (
        "DPM2 a",
        "dpm_2_ancestral",
        "k_dpm_2_a",
        "k_dpm_2_ancestral",
        "KDPM2AncestralDiscrete",
    )
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = alg.dpm_2_a
    reference = "k_diffusion.sampling.sample_dpm_2_ancestral"
    diffusers_class = "KDPM2AncestralDiscreteScheduler"


class DPMPP2SAncestral(KDiscreteSampler):
    name = "dpmpp_2s_a"
    label = "DPM++ 2S a"
    aliases: ClassVar[tuple[str, ...]] = ("DPM++ 2S a", "dpmpp_2s_ancestral", "k_dpmpp_2s_a", "k_dpmpp_2s_ancestral")
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = alg.dpmpp_2s_a
    reference = "k_diffusion.sampling.sample_dpmpp_2s_ancestral"


class DPMPP3MSDE(KDiscreteSampler):
    name = "dpmpp_3m_sde"
    label = "DPM++ 3M SDE"
    aliases: ClassVar[tuple[str, ...]] = ("DPM++ 3M SDE", "k_dpmpp_3m_sde", "dpmpp_3m_sde_gpu")  # _gpu: see DPMPP2MSDE
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = alg.dpmpp_3m_sde
    reference = "k_diffusion.sampling.sample_dpmpp_3m_sde"


class LMS(KDiscreteSampler):
    name = "lms"
    label = "LMS"
    aliases: ClassVar[tuple[str, ...]] = ("LMS", "k_lms", "lms_discrete", "LMSDiscrete")
    algorithm: ClassVar[Algorithm] = alg.lms
    reference = "k_diffusion.sampling.sample_lms"
    diffusers_class = "LMSDiscreteScheduler"


class DDPM(KDiscreteSampler):
    """ComfyUI's ddpm: diffusers' DDPMScheduler step ("fixed_small" variance) on any sigma schedule;
    x0 is not clipped, so a config asking for ``clip_sample`` is refused."""

    name = "ddpm"
    label = "DDPM"
    aliases: ClassVar[tuple[str, ...]] = ("DDPM", "ddpm_discrete")
    needs_noise = True
    algorithm: ClassVar[Algorithm] = ui.ddpm

    def _configure(self) -> None:
        super()._configure()
        if self.config.clip_sample:
            raise OptionError("scheduler config clip_sample=True is not supported by 'ddpm' (ComfyUI's does not clip)")

    reference = "comfy.k_diffusion.sampling.sample_ddpm"
    diffusers_class = "DDPMScheduler"


class DDIMSigmas(KDiscreteSampler):
    """ComfyUI's ``ddim``: k-diffusion's ``sample_euler`` on the model's sigmas, so it takes every
    sigma schedule. "DDIM" with a schedule the diffusers-timestep ``ddim`` lacks ("DDIM Karras",
    ComfyUI's ddim + karras) resolves here (``schedule_variant_of``); "normal" and "sgm_uniform"
    stay diffusers' DDIMScheduler. No ``eta``: ComfyUI's ddim has none."""

    name = "ddim_sigmas"
    label = "DDIM"
    schedule_variant_of = "ddim"
    algorithm: ClassVar[Algorithm] = alg.euler
    reference = "k_diffusion.sampling.sample_euler"


class LCMSigmas(KDiscreteSampler):
    """ComfyUI's ``lcm`` (``sample_lcm``) on the model's sigmas: every step takes the x0 estimate
    and re-noises it to the next sigma. "LCM Karras" / ComfyUI's lcm + karras resolve here
    (``schedule_variant_of``); "normal" stays diffusers' LCMScheduler. The x0 estimate is the
    model's plain one, as in ComfyUI's default (eps / v) model sampling: LCM's consistency
    boundary scalings (c_skip, c_out), which ComfyUI adds only under ModelSamplingDiscrete "lcm",
    are not applied (at timestep t they move x0 by about 0.0025 / t^2 of the sample)."""

    name = "lcm_sigmas"
    label = "LCM"
    schedule_variant_of = "lcm"
    needs_noise = True
    algorithm: ClassVar[Algorithm] = ui.lcm
    reference = "comfy.k_diffusion.sampling.sample_lcm"


class HeunPP2(KDiscreteSampler):
    name = "heunpp2"
    label = "Heun++ 2"
    aliases: ClassVar[tuple[str, ...]] = ("Heun++ 2", "heun++2", "heunpp")
    order = 3
    algorithm: ClassVar[Algorithm] = ui.heunpp2
    reference = "comfy.k_diffusion.sampling.sample_heunpp2"


class EulerCFGPP(KDiscreteSampler):
    name = "euler_cfg_pp"
    label = "Euler CFG++"
    aliases: ClassVar[tuple[str, ...]] = ("Euler CFG++", "euler_cfgpp")
    needs_uncond = True
    algorithm: ClassVar[Algorithm] = ui.euler_cfg_pp
    reference = "comfy.k_diffusion.sampling.sample_euler_cfg_pp"


class DPMPP2MCFGPP(KDiscreteSampler):
    name = "dpmpp_2m_cfg_pp"
    label = "DPM++ 2M CFG++"
    aliases: ClassVar[tuple[str, ...]] = ("DPM++ 2M CFG++", "dpmpp_2m_cfgpp")
    needs_uncond = True
    algorithm: ClassVar[Algorithm] = ui.dpmpp_2m_cfg_pp
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_2m_cfg_pp"


class Restart(KDiscreteSampler):
    """A1111's Restart sampler; from 20 steps it replaces the schedule by Karras sigmas and adds its
    restart segments (see ``k_algorithms.restart_pairs``), so it runs more model calls than steps."""

    name = "restart"
    label = "Restart"
    aliases: ClassVar[tuple[str, ...]] = ("Restart", "restart_sampler")
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.restart
    reference = "stable-diffusion-webui modules/sd_samplers_extra.py restart_sampler"
    # ComfyUI's core has no Restart sampler (comfy/samplers.py KSAMPLER_NAMES). Forge lists A1111's
    # restart_sampler for every model and runs it unchanged on flow sigmas: its restart jump adds
    # variance-exploding noise sqrt(s^2 - s_last^2) to x, which leaves a flow model's sample off its
    # marginal (1 - s) x0 + s z (at s = 1 the model expects pure noise, the jump keeps ~0.9 x0).
    flow_note = (
        "ComfyUI's core has no Restart sampler; A1111/Forge's restart_sampler re-noises as x + z sqrt(s^2 - "
        "s_last^2), a variance-exploding jump with no flow form (a flow model's sample is (1 - s) x0 + s z)"
    )


# -- flow models (ComfyUI's samplers on CONST model sampling) -------------------------------------


class _Flow(KFlowSampler):
    aliases: ClassVar[tuple[str, ...]] = ()
    diffusers_class = ""


class EulerAncestralFlow(_Flow):
    name = "euler_a_flow"
    label = "Euler a"
    variant_of = "euler_a"
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.euler_a_rf
    reference = "comfy.k_diffusion.sampling.sample_euler_ancestral_RF"


class HeunFlow(_Flow):
    name = "heun_flow"
    label = "Heun"
    variant_of = "heun"
    order = 2
    algorithm: ClassVar[Algorithm] = alg.heun
    reference = "k_diffusion.sampling.sample_heun"


class DPMPP2MFlow(_Flow):
    name = "dpmpp_2m_flow"
    label = "DPM++ 2M"
    variant_of = "dpmpp_2m"
    algorithm: ClassVar[Algorithm] = alg.dpmpp_2m
    reference = "k_diffusion.sampling.sample_dpmpp_2m"


class DPMPP2SAncestralFlow(_Flow):
    name = "dpmpp_2s_a_flow"
    label = "DPM++ 2S a"
    variant_of = "dpmpp_2s_a"
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.dpmpp_2s_a_rf
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_2s_ancestral_RF"


class LMSFlow(_Flow):
    name = "lms_flow"
    label = "LMS"
    variant_of = "lms"
    algorithm: ClassVar[Algorithm] = alg.lms
    reference = "comfy.k_diffusion.sampling.sample_lms"


class DPM2Flow(_Flow):
    name = "dpm_2_flow"
    label = "DPM2"
    variant_of = "dpm_2"
    order = 2
    algorithm: ClassVar[Algorithm] = alg.dpm_2
    reference = "k_diffusion.sampling.sample_dpm_2"


class DPM2AncestralFlow(_Flow):
    name = "dpm_2_a_flow"
    label = "DPM2 a"
    variant_of = "dpm_2_a"
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.dpm_2_a_rf
    reference = "comfy.k_diffusion.sampling.sample_dpm_2_ancestral_RF"


class HeunPP2Flow(_Flow):
    name = "heunpp2_flow"
    label = "Heun++ 2"
    variant_of = "heunpp2"
    order = 3
    algorithm: ClassVar[Algorithm] = ui.heunpp2
    reference = "comfy.k_diffusion.sampling.sample_heunpp2"


class EulerCFGPPFlow(_Flow):
    name = "euler_cfg_pp_flow"
    label = "Euler CFG++"
    variant_of = "euler_cfg_pp"
    needs_uncond = True
    algorithm: ClassVar[Algorithm] = ui.euler_cfg_pp
    reference = "comfy.k_diffusion.sampling.sample_euler_cfg_pp"


class DPMPP2MSDEFlow(_Flow):
    """ComfyUI's ``sample_dpmpp_2m_sde`` on a flow model: half log-SNR form, first sigma offset
    (``ui_algorithms.dpmpp_sde_rf``; worked example in the module docstring)."""

    name = "dpmpp_2m_sde_flow"
    label = "DPM++ 2M SDE"
    variant_of = "dpmpp_2m_sde"
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.dpmpp_2m_sde_rf
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_2m_sde"


class DPMPP3MSDEFlow(_Flow):
    """ComfyUI's ``sample_dpmpp_3m_sde`` on a flow model (``ui_algorithms.dpmpp_sde_rf``, order 3)."""

    name = "dpmpp_3m_sde_flow"
    label = "DPM++ 3M SDE"
    variant_of = "dpmpp_3m_sde"
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.dpmpp_3m_sde_rf
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_3m_sde"


class DDPMFlow(_Flow):
    """ComfyUI's ``sample_ddpm`` on a flow model: ComfyUI applies its variance-preserving DDPM step
    (``ui_algorithms.ddpm``) to the flow sigmas unchanged (no ``CONST`` form, no first-sigma
    offset), and so does this class, so images match ComfyUI's; it is not a DDPM posterior of the
    flow model's interpolation."""

    name = "ddpm_flow"
    label = "DDPM"
    variant_of = "ddpm"
    needs_noise = True
    algorithm: ClassVar[Algorithm] = ui.ddpm
    reference = "comfy.k_diffusion.sampling.sample_ddpm"


class DPMPP2MCFGPPFlow(_Flow):
    """ComfyUI's ``sample_dpmpp_2m_cfg_pp`` on a flow model: unchanged (t = -log sigma, no
    ``CONST`` form, no first-sigma offset: -log 1 = 0 is finite), as ComfyUI runs it."""

    name = "dpmpp_2m_cfg_pp_flow"
    label = "DPM++ 2M CFG++"
    variant_of = "dpmpp_2m_cfg_pp"
    needs_uncond = True
    algorithm: ClassVar[Algorithm] = ui.dpmpp_2m_cfg_pp
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_2m_cfg_pp"


class DPMPPSDEFlow(_Flow):
    """ComfyUI's ``sample_dpmpp_sde`` on a flow model: half log-SNR form, first sigma offset, two
    model calls per step (the midpoint's), two draws per step joined as the Brownian tree's
    increments (``ui_algorithms.dpmpp_2s_sde_rf``)."""

    name = "dpmpp_sde_flow"
    label = "DPM++ SDE"
    variant_of = "dpmpp_sde"
    order = 2
    needs_noise = True
    option_defaults: ClassVar[dict[str, float]] = S_NOISE
    algorithm: ClassVar[Algorithm] = ui.dpmpp_2s_sde_rf
    reference = "comfy.k_diffusion.sampling.sample_dpmpp_sde"


class DDIMFlow(_Flow):
    """ComfyUI's ``ddim`` on a flow model: k-diffusion's ``sample_euler`` on the flow sigmas, as on
    every model (ComfyUI's ``sampler_object("ddim")``), so "DDIM" and "DDIM Karras" run here. Its
    ``eta`` is 0 only: deterministic DDIM on the flow interpolation is exactly this Euler step; a
    stochastic DDIM (eta > 0) has no flow form in ComfyUI or A1111 and is refused."""

    name = "ddim_flow"
    label = "DDIM"
    variant_of = "ddim"
    option_defaults: ClassVar[dict[str, float]] = {"eta": 0.0}
    algorithm: ClassVar[Algorithm] = alg.euler
    reference = "k_diffusion.sampling.sample_euler"

    def _configure(self) -> None:
        super()._configure()
        if self.options["eta"] != 0:
            raise OptionError(
                f"DDIM on a flow model runs ComfyUI's ddim (Euler on the flow sigmas), which has no eta; "
                f"got eta={self.options['eta']:g} (use 0, or an ancestral / SDE sampler for noise)"
            )


class LCMFlow(_Flow):
    """ComfyUI's ``sample_lcm`` on a flow model: x0 estimate, then re-noised to the next sigma by
    the ``CONST`` noise scaling ``s' z + (1 - s') x0`` (``ui_algorithms.lcm``); every flow schedule."""

    name = "lcm_flow"
    label = "LCM"
    variant_of = "lcm"
    needs_noise = True
    algorithm: ClassVar[Algorithm] = ui.lcm
    reference = "comfy.k_diffusion.sampling.sample_lcm"
