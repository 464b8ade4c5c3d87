"""Softmax-weighted minimax — Algorithm 1 of Wang et al., *Task-Robust Pre-Training for Worst-Case Downstream
Adaptation*.

``w = (1 - eps) * softmax(alpha_k * L) + eps / |P|`` over the present tasks P, computed in fp32 on detached loss
estimates. Stepping along ``sum_t w_t grad L_t`` is gradient descent on the smooth maximum
``(1 / alpha) * logsumexp(alpha * L)``, which tends to ``max_t L_t`` as alpha grows. ``alpha_schedule='sqrt'`` uses
``alpha_k = alpha_0 * sqrt(k + 1)`` (k = optimizer step), after Thm 3.1, whose guarantee needs alpha_k = O~(sqrt(k))
with a horizon-dependent constant, convex Lipschitz bounded losses, exact gradients and the averaged iterate: for a
deep network with alpha_0 = 1 the schedule is a heuristic.
The weights sum to 1 over the present tasks.

Automatic alpha (``alpha_auto``). A fixed alpha means different things for losses of different scales (alpha = 1 on
raw losses of mixed scale can put almost all weight on one task; changing a loss's unit changes the weights). With
``alpha_auto`` the strategy instead fixes how concentrated the weights are: each step it chooses ``alpha >= 0`` so
that the *effective number of tasks* of the weights actually used,

    ``N_eff(w) = exp(H(w)) = exp(-sum_t w_t log w_t)``  (Hill's diversity of order 1; 1 = one task, ``|P|`` = uniform),

equals the target ``k`` (``alpha_auto_k``; unset, ``k = sqrt(|P|)``: ``H(w) = log(|P|) / 2``, half-way in entropy
between hardmax and uniform). The chosen alpha is scale-equivariant: losses multiplied by ``c`` (a change of unit)
give ``alpha / c`` and the same weights; a constant added to every loss changes nothing.

The root find. With ``p = softmax(alpha * l)`` and ``H(alpha) = log Z - alpha E_p[l]``, ``dH/dalpha = -alpha Var_p(l)``:
strictly negative for ``alpha > 0`` whenever the present losses are not all equal (``p`` has full support), so ``N_eff``
falls strictly from ``|P|`` at ``alpha = 0`` towards ``m`` (the number of tasks tied at the largest loss) as ``alpha ->
inf``. Edge cases: all present losses equal, or ``k >= |P|`` (one task included): ``alpha = 0``, uniform weights.
Otherwise alpha is searched in ``[0, ALPHA_AUTO_MAX_LOGIT / spread]`` (spread = largest minus smallest present loss, so
``alpha * spread <= 1e4``, finite; a task whose loss is ``g`` below the largest gets ``exp(-1e4 g / spread)`` times the
top task's weight: hardmax for any gap above ``1e-2 * spread``); a target at or below ``N_eff`` at that cap (``k -> 1``,
ties at the top, or a weight floor that keeps ``N_eff`` above ``k``) takes the cap, the closest finite approach to
hardmax. Between the ends, bisection in float64 to relative width 1e-15; it needs only continuity and the sign change at
the ends, so it also holds with ``weight_floor > 0``, where the target is met by the floored weights ``(1 - eps) p + eps
/ |P|``. EMA and the loss normalisation act before: alpha is chosen on the same (normalised, averaged) estimates the
softmax weighs. ``alpha_schedule='sqrt'`` is refused with ``alpha_auto`` (the schedule raises alpha over time; with
``alpha_auto`` the target ``k`` sets alpha) and so is a non-default ``alpha``. The alpha used at the last step is part
of the weighting state and is logged as ``minimax_alpha``; the next alpha is a function of the estimates, also in the
state, so a resumed run chooses the same alpha.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting, masked_uniform

#: cap of ``alpha * (max - min)`` of the present losses for the automatic alpha (effectively hardmax)
ALPHA_AUTO_MAX_LOGIT = 1e4
#: bisection steps (the interval also stops shrinking at a relative width of 1e-15)
_BISECTION_STEPS = 200


def effective_number_of_tasks(weights: torch.Tensor) -> float:
    """``exp(H(w))`` of non-negative weights summing to 1 (zero weights contribute nothing)."""
    w = weights.double()
    return math.exp(float(-torch.special.xlogy(w, w).sum()))


def _floored_softmax(alpha: float, losses: torch.Tensor, floor: float) -> torch.Tensor:
    p = torch.softmax(alpha * (losses - losses.max()), dim=0)
    return (1 - floor) * p + floor / losses.numel()


def solve_alpha(losses: torch.Tensor, k: float, weight_floor: float = 0.0) -> float:
    """The ``alpha >= 0`` with ``exp(H((1 - eps) softmax(alpha * losses) + eps / n)) = k``, ``losses`` the ``n``
    present tasks' losses (0 when all are equal or ``k >= n``; the cap ``ALPHA_AUTO_MAX_LOGIT / spread`` when ``k``
    is not reached below it). See the module docstring for why the root is unique and found by bisection."""
    losses = losses.double()
    n = losses.numel()
    spread = float(losses.max() - losses.min())
    if n <= 1 or k >= n or not spread > 0:
        return 0.0
    hi = ALPHA_AUTO_MAX_LOGIT / spread

    def excess(alpha: float) -> float:  # N_eff(alpha) - k: positive at 0, falls with alpha
        return effective_number_of_tasks(_floored_softmax(alpha, losses, weight_floor)) - k

    if excess(hi) >= 0:
        return hi
    lo = 0.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


class MinimaxWeighting(Weighting):
    """Algorithm 1: softmax of the scaled task-loss estimates, optionally floored by a uniform mixture.

    Args:
        alpha: softmax temperature alpha (or alpha_0 of the schedule); > 0.
        alpha_schedule: ``constant`` or ``sqrt``.
        weight_floor: eps in [0, 1): mixing weight of the uniform distribution, so no present task gets less than
            ``eps / |P|``.
        alpha_auto: choose alpha each step so that ``exp(H(w)) = alpha_auto_k`` over the present tasks.
        alpha_auto_k: the target effective number of tasks k >= 1 (setting it turns ``alpha_auto`` on); ``None``:
            ``sqrt(|P|)``.
    """

    def __init__(
        self,
        num_tasks: int,
        alpha: float = DEFAULTS.alpha,
        alpha_schedule: str = DEFAULTS.alpha_schedule,
        weight_floor: float = DEFAULTS.weight_floor,
        alpha_auto: bool = DEFAULTS.alpha_auto,
        alpha_auto_k: float | None = DEFAULTS.alpha_auto_k,
        **kwargs,
    ) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(
            alpha=alpha, alpha_schedule=alpha_schedule, weight_floor=weight_floor, alpha_auto_k=alpha_auto_k
        )
        alpha_auto = bool(alpha_auto) or alpha_auto_k is not None  # a target turns alpha_auto on
        if alpha_auto and alpha_schedule != "constant":
            raise ValueError(
                f"alpha_schedule={alpha_schedule!r} does not apply with alpha_auto (alpha is chosen each step to meet "
                "alpha_auto_k): use alpha_schedule='constant'"
            )
        if alpha_auto and alpha != DEFAULTS.alpha:
            raise ValueError(
                f"alpha={alpha} does not apply with alpha_auto (alpha is chosen each step): leave it unset"
            )
        self.alpha = alpha
        self.alpha_schedule = alpha_schedule
        self.weight_floor = weight_floor
        self.alpha_auto = alpha_auto
        self.alpha_auto_k = None if alpha_auto_k is None else float(alpha_auto_k)
        #: alpha used at the last step (NaN before the first); in the state and the logs
        self.last_alpha = torch.full((1,), math.nan)

    def current_alpha(self) -> float:
        """alpha_k for the step about to be taken (fixed or scheduled alpha; with ``alpha_auto`` the last alpha)."""
        if self.alpha_auto:
            return float(self.last_alpha[0])
        return self.alpha * math.sqrt(self.step + 1) if self.alpha_schedule == "sqrt" else self.alpha

    def target_k(self, num_present: int) -> float:
        """The effective number of tasks ``alpha_auto`` aims at for ``num_present`` present tasks."""
        return math.sqrt(num_present) if self.alpha_auto_k is None else self.alpha_auto_k

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        if self.alpha_auto:
            chosen = losses[present].double()
            alpha = solve_alpha(chosen, self.target_k(int(present.sum())), self.weight_floor)
            self.last_alpha.fill_(alpha)
            w = torch.zeros(self.num_tasks, dtype=torch.float64)
            w[present] = _floored_softmax(alpha, chosen, self.weight_floor)
            return w.float()
        alpha = self.current_alpha()
        self.last_alpha.fill_(alpha)
        logits = (alpha * losses.float()).masked_fill(~present, -math.inf)
        w = torch.softmax(logits, dim=0)
        return (1 - self.weight_floor) * w + self.weight_floor * masked_uniform(present)

    def log_values(self) -> dict[str, float]:
        """Scalars the trainer logs with the task weights: the alpha of the last step."""
        alpha = float(self.last_alpha[0])
        return {} if math.isnan(alpha) else {"minimax_alpha": alpha}

    def options(self) -> dict[str, Any]:
        """The constructor options; ``alpha_auto`` and its target only when on, so that checkpoints written before
        they existed (and runs without them) record the same options and resume."""
        options = super().options()
        if not self.alpha_auto:
            del options["alpha_auto"], options["alpha_auto_k"]
        return options

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "last_alpha": self.last_alpha}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # states saved before last_alpha was recorded: unknown (the next step chooses it again)
        super().load_state_dict({"last_alpha": [None], **state})
