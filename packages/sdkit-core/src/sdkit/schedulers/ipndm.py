"""iPNDM and iPNDM_v: ComfyUI's ``ipndm`` / ``ipndm_v`` (Zhang & Chen's improved PNDM, as zju-pi's
diff-solvers have it), on k-diffusion sigmas and on flow sigmas.

Written down from ComfyUI's ``comfy/k_diffusion/sampling.py`` (no code copied). With ``sigma_i``
the schedule (0 last), the model's clean estimate ``x0`` and ``d_i = (x_i - x0) / sigma_i`` (the
Karras ODE derivative; a flow model's velocity), each step keeps the last three ``d`` of this
run and, with ``h = sigma_{i+1} - sigma_i``:

- the step to sigma 0 is ``x_{i+1} = x0`` (the clean estimate);
- iPNDM: ``x_{i+1} = x_i + h * D`` with Adams-Bashforth's fixed-step weights on the ``d`` it has
  (its order grows 1, 2, 3, 4 over the first steps): ``D = d_i``, ``(3 d_i - d_{i-1}) / 2``,
  ``(23 d_i - 16 d_{i-1} + 5 d_{i-2}) / 12``, ``(55 d_i - 59 d_{i-1} + 37 d_{i-2} - 9 d_{i-3}) / 24``;
- iPNDM_v: the same with weights from the step sizes ``h_n = h``, ``h_{n-1} = sigma_i - sigma_{i-1}``,
  ``h_{n-2}``, ``h_{n-3}`` (:func:`variable_weights`, ComfyUI's expressions, operator precedence
  included). Second order: ``(1 + r / 2, -r / 2)`` with ``r = h_n / h_{n-1}`` (variable-step
  Adams-Bashforth 2). Third order adds ``t1 = (1 - h_n / (3 (h_n + h_{n-1})) * (h_n (h_n +
  h_{n-1})) / (h_{n-1} (h_{n-1} + h_{n-2}))) / 2`` to the first weight, ``-(1 + h_{n-1} /
  h_{n-2}) t1`` to the second and ``t1 h_{n-1} / h_{n-2}`` as the third; the fourth order adds a
  ``t2`` term likewise. The weights of orders 1-3 sum to 1; with equal steps the third order is
  Adams-Bashforth 3 (23, -16, 5) / 12. The fourth order's sum to ``1 + t2 * ratio * (h_{n-2} /
  h_{n-3} - h_{n-1} / h_{n-2})`` (1 only when the earlier steps shrink geometrically) and with equal
  steps are (57, -65, 43, -11) / 24, not Adams-Bashforth 4 (55, -59, 37, -9) / 24: ComfyUI's
  fourth-order expression is kept as it is, so results match ComfyUI's.

Worked example (iPNDM_v, third order): sigmas 4, 3, 2, 1 at the step from 2 to 1: h_n = h_{n-1} =
h_{n-2} = -1, r = 1, t1 = (1 - (1/6) * 1) / 2 = 5/12, so the weights are 3/2 + 5/12 = 23/12,
-1/2 - 2 * 5/12 = -16/12 and 5/12.

iPNDM (fixed weights) on discrete models is checked against diffusers' IPNDMScheduler, which runs
the same update in variance-preserving coordinates (fed the same sigmas; its last step differs:
it does not return the clean estimate).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from sdkit.schedulers.base import NoiseFn, Scheduler, f32
from sdkit.schedulers.flow_match import FlowMatchEuler
from sdkit.schedulers.k_samplers import Euler

F32 = NDArray[np.float32]
FIXED_WEIGHTS: tuple[tuple[float, ...], ...] = (
    (1.0,),
    (3 / 2, -1 / 2),
    (23 / 12, -16 / 12, 5 / 12),
    (55 / 24, -59 / 24, 37 / 24, -9 / 24),
)


def variable_weights(h: list[float]) -> tuple[float, ...]:
    """ComfyUI's iPNDM_v weights for step sizes ``h = [h_n, h_{n-1}, ...]`` (order = len(h))."""
    if len(h) == 1:
        return (1.0,)
    h_n, h_1 = h[0], h[1]
    first, second = (2 + h_n / h_1) / 2, -(h_n / h_1) / 2
    if len(h) == 2:
        return first, second
    h_2 = h[2]
    t1 = (1 - h_n / (3 * (h_n + h_1)) * (h_n * (h_n + h_1)) / (h_1 * (h_1 + h_2))) / 2
    if len(h) == 3:
        return first + t1, second - (1 + h_1 / h_2) * t1, t1 * h_1 / h_2
    h_3 = h[3]
    t2 = ((1 - h_n / (3 * (h_n + h_1))) / 2 + (1 - h_n / (2 * (h_n + h_1))) * h_n / (6 * (h_n + h_1 + h_2))) * (
        h_n * (h_n + h_1) * (h_n + h_1 + h_2) / (h_1 * (h_1 + h_2) * (h_1 + h_2 + h_3))
    )
    ratio = h_1 * (h_1 + h_2) / (h_2 * (h_2 + h_3))
    return (
        first + t1 + t2,
        second - (1 + h_1 / h_2) * t1 - (1 + h_1 / h_2 + ratio) * t2,
        t1 * h_1 / h_2 + (h_1 / h_2 + ratio * (1 + h_2 / h_3)) * t2,
        -t2 * ratio * h_1 / h_2,
    )


class IPNDMSolver(Scheduler):
    """The iPNDM step; the class it is combined with gives ``_derivative``."""

    reference: ClassVar[str] = ""  # the written-down algorithm a class without a diffusers oracle follows
    variable: ClassVar[bool] = False
    max_order: ClassVar[int] = 4

    def _derivative(self, model_output: F32, sample: F32) -> tuple[F32, F32]:
        """(d, clean estimate) at the current sigma."""
        raise NotImplementedError

    def _reset_solver(self) -> None:
        self._previous: list[F32] = []  # earlier d of this run, newest last

    def weights(self, index: int, order: int) -> tuple[float, ...]:
        """The weights of d_i, d_{i-1}, ... for the step from ``index`` with ``order`` of them."""
        if not self.variable:
            return FIXED_WEIGHTS[order - 1]
        sig = [float(s) for s in self._sigmas]
        steps = [sig[index + 1] - sig[index]] + [sig[index - k] - sig[index - k - 1] for k in range(order - 1)]
        return variable_weights(steps)

    def _step(self, model_output: F32, sample: F32, noise: NoiseFn | None) -> F32:
        i = self._index
        d, clean = self._derivative(model_output, sample)
        earlier = self._previous
        self._previous = [*earlier, d][-(self.max_order - 1) :]
        if self._sigmas[i + 1] == 0:
            return clean
        combined = d
        weights = self.weights(i, len(earlier) + 1)
        if len(weights) > 1:
            combined = f32(np.float32(weights[0]) * d)
            for weight, older in zip(weights[1:], reversed(earlier), strict=False):
                combined = f32(combined + np.float32(weight) * older)
        return f32(sample + (self._sigmas[i + 1] - self._sigmas[i]) * combined)


class IPNDM(IPNDMSolver, Euler):
    name = "ipndm"
    label = "iPNDM"
    aliases: ClassVar[tuple[str, ...]] = ("iPNDM",)
    diffusers_class = "IPNDMScheduler"

    def _derivative(self, model_output: F32, sample: F32) -> tuple[F32, F32]:
        sigma = self._sigmas[self._index]
        clean = self._denoised(model_output, sample, sigma)
        return f32((sample - clean) / sigma), clean

    def _build(self, steps: int, strength: float) -> None:
        super()._build(steps, strength)
        self._reset_solver()


class IPNDMV(IPNDM):
    name = "ipndm_v"
    label = "iPNDM_v"
    aliases: ClassVar[tuple[str, ...]] = ("iPNDM_v", "ipndm-v")
    variable = True
    diffusers_class = ""
    reference = "ComfyUI's sample_ipndm_v (sdkit.schedulers.ipndm)"


class IPNDMFlow(IPNDMSolver, FlowMatchEuler):
    name = "ipndm_flow"
    label = "iPNDM"
    aliases: ClassVar[tuple[str, ...]] = ()
    variant_of = "ipndm"
    diffusers_class = ""
    reference = "ComfyUI's sample_ipndm on flow sigmas (sdkit.schedulers.ipndm)"

    def _derivative(self, model_output: F32, sample: F32) -> tuple[F32, F32]:
        # (x - x0) / sigma with x0 = x - sigma * v is v itself.
        return model_output, f32(sample - self._sigmas[self._index] * model_output)

    def _build(self, steps: int, strength: float) -> None:
        super()._build(steps, strength)
        self._reset_solver()


class IPNDMVFlow(IPNDMFlow):
    name = "ipndm_v_flow"
    label = "iPNDM_v"
    variant_of = "ipndm_v"
    variable = True
