"""Uncertainty weighting — Kendall, Gal & Cipolla, *Multi-Task Learning Using Uncertainty to Weigh Losses for Scene
Geometry and Semantics* (CVPR 2018).

With a learnable log-variance ``s_t = log sigma_t^2`` per task the objective is
``sum_t 0.5 * exp(-s_t) * L_t + 0.5 * s_t`` (eq. 7's homoscedastic form). The weights ``0.5 * exp(-s_t)`` carry
gradient to ``s``; the ``0.5 * s_t`` term is :meth:`UncertaintyWeighting.regularizer`. The optimum for fixed losses is
``s_t = log L_t``. The trainer's optimizer trains ``s`` (no weight decay) and checkpoints its state.

The weights are not normalised: they sum to ``0.5 * sum_{t in P} exp(-s_t)`` over the present tasks P (``|P| / 2`` at
the start, since ``s = 0``), and each tends to ``1 / (2 L_t)``.
"""

from __future__ import annotations

import torch

from .base import Weighting


class UncertaintyWeighting(Weighting):
    """Learned homoscedastic-uncertainty weights ``0.5 * exp(-s_t)``, ``s`` initialised to 0."""

    loss_driven = False

    def __init__(self, num_tasks: int, **kwargs) -> None:
        super().__init__(num_tasks, **kwargs)
        self.log_vars = torch.nn.Parameter(torch.zeros(num_tasks))

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return self.differentiable_weights(losses, present).detach()

    def differentiable_weights(self, weights: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return 0.5 * torch.exp(-self.log_vars) * present.to(self.log_vars.device).float()

    def regularizer(self, present: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.log_vars * present.to(self.log_vars.device).float()).sum()

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.log_vars]

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "log_vars": self.log_vars}
