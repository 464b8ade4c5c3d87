"""Softmax-weighted minimax — Algorithm 1 of Wang et al., *Task-Robust Pre-Training for Worst-Case Downstream
Adaptation*.

``w = (1 - eps) * softmax(alpha_k * L) + eps / |P|`` over the present tasks P, computed in fp32 on detached loss
estimates. Stepping along ``sum_t w_t grad L_t`` is gradient descent on the smooth maximum
``(1 / alpha) * logsumexp(alpha * L)``, which tends to ``max_t L_t`` as alpha grows. ``alpha_schedule='sqrt'`` uses
``alpha_k = alpha_0 * sqrt(k + 1)`` (k = optimizer step), the schedule behind the O(1/sqrt(K)) guarantee of Thm 3.1.
The weights sum to 1 over the present tasks.
"""

from __future__ import annotations

import math

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting, masked_uniform


class MinimaxWeighting(Weighting):
    """Algorithm 1: softmax of the scaled task-loss estimates, optionally floored by a uniform mixture.

    Args:
        alpha: softmax temperature alpha (or alpha_0 of the schedule); > 0.
        alpha_schedule: ``constant`` or ``sqrt``.
        weight_floor: eps in [0, 1): mixing weight of the uniform distribution, so no present task gets less than
            ``eps / |P|``.
    """

    def __init__(
        self,
        num_tasks: int,
        alpha: float = DEFAULTS.alpha,
        alpha_schedule: str = DEFAULTS.alpha_schedule,
        weight_floor: float = DEFAULTS.weight_floor,
        **kwargs,
    ) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(alpha=alpha, alpha_schedule=alpha_schedule, weight_floor=weight_floor)
        self.alpha = alpha
        self.alpha_schedule = alpha_schedule
        self.weight_floor = weight_floor

    def current_alpha(self) -> float:
        """alpha_k for the step about to be taken."""
        return self.alpha * math.sqrt(self.step + 1) if self.alpha_schedule == "sqrt" else self.alpha

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        logits = (self.current_alpha() * losses.float()).masked_fill(~present, -math.inf)
        w = torch.softmax(logits, dim=0)
        return (1 - self.weight_floor) * w + self.weight_floor * masked_uniform(present)
