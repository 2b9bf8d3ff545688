"""sdkit's sampler and schedule names <-> stable-diffusion.cpp's, both ways.

A request's sampler and schedule are sdkit's canonical names (``GenerationRequest.create`` resolved
"DPM++ 2M Karras" to ``("dpmpp_2m", "karras")``); stable-diffusion.cpp names the same methods its
own way (``dpm++2m``, ``discrete``). Only the methods both implement are mapped; a sampler or
schedule sd.cpp has no counterpart for is refused naming the field, never replaced by another.

sd.cpp runs its own implementation of each method (its noise, its sigma tables): the same names
are the same algorithms, not bit-identical images to sdkit's own pipelines.
"""

from __future__ import annotations

from sdkit.errors import OptionError

# sdkit canonical sampler -> sd.cpp ``sample_method``. "ddim" is sd.cpp's DDIM (trailing timesteps).
SAMPLERS: dict[str, str] = {
    "euler": "euler",
    "euler_a": "euler_a",
    "heun": "heun",
    "dpmpp_2m": "dpm++2m",
    "ddim": "ddim_trailing",
    "lcm": "lcm",
    # the flow-matching variant sdkit picks for "euler" on a flow model: sd.cpp's euler is that there
    "euler_flow": "euler",
}
# sdkit canonical schedule -> sd.cpp ``scheduler``. "normal" is A1111's "Automatic": the model's
# own default in sd.cpp ("discrete" for SD 1.x/2.x/XL).
SCHEDULES: dict[str, str] = {
    "normal": "default",
    "karras": "karras",
    "exponential": "exponential",
    "sgm_uniform": "sgm_uniform",
    "simple": "simple",
}
# sd.cpp -> sdkit, for reading sd.cpp's own parameters back (its CLI's PNG text).
SDCPP_SAMPLERS: dict[str, str] = {
    "euler": "euler",
    "euler_a": "euler_a",
    "heun": "heun",
    "dpm++2m": "dpmpp_2m",
    "ddim_trailing": "ddim",
    "lcm": "lcm",
}
SDCPP_SCHEDULES: dict[str, str] = {
    "default": "normal",
    "discrete": "normal",
    "karras": "karras",
    "exponential": "exponential",
    "sgm_uniform": "sgm_uniform",
    "simple": "simple",
}


def to_sdcpp(sampler: str, schedule: str) -> tuple[str, str]:
    """(sd.cpp sample_method, scheduler) for sdkit's canonical names, or an ``OptionError`` naming
    the field sd.cpp cannot honour and the names it can."""
    method = SAMPLERS.get(sampler)
    if method is None:
        able = ", ".join(n for n in SAMPLERS if n != "euler_flow")
        raise OptionError(f"sampler {sampler!r}: stable-diffusion.cpp has no such sampler (it runs {able})")
    scheduler = SCHEDULES.get(schedule)
    if scheduler is None:
        raise OptionError(
            f"schedule {schedule!r}: stable-diffusion.cpp has no such schedule (it runs {', '.join(SCHEDULES)})"
        )
    return method, scheduler


def from_sdcpp(method: str, scheduler: str = "default") -> tuple[str, str]:
    """sdkit's (sampler, schedule) for sd.cpp's names, or an ``OptionError`` for one sdkit lacks."""
    sampler = SDCPP_SAMPLERS.get(method.strip().lower())
    schedule = SDCPP_SCHEDULES.get(scheduler.strip().lower())
    if sampler is None or schedule is None:
        missing = method if sampler is None else scheduler
        raise OptionError(f"stable-diffusion.cpp's {missing!r} has no sdkit counterpart")
    return sampler, schedule
