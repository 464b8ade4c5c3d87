"""Group DRO — online exponentiated-gradient ascent on the task simplex.

Sagawa et al., *Distributionally Robust Neural Networks for Group Shifts* (ICLR 2020), Algorithm 1, and the domain
weights of Xie et al., *DoReMi* (NeurIPS 2023):

``log q_t <- log q_t + eta * L_t`` for present tasks, ``q = softmax(log q)`` over the present tasks, and the returned
weights ``w = (1 - eps) * q + eps / |P|`` (DoReMi's smoothing). Unlike Algorithm 1's softmax of the current losses,
q accumulates the whole loss history. The weights sum to 1 over the present tasks.
"""

from __future__ import annotations

import math

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting, masked_uniform


class GroupDROWeighting(Weighting):
    """Exponentiated-gradient weights with step ``dro_step_size`` (eta) and smoothing ``dro_smoothing`` (eps)."""

    def __init__(
        self,
        num_tasks: int,
        dro_step_size: float = DEFAULTS.dro_step_size,
        dro_smoothing: float = DEFAULTS.dro_smoothing,
        **kwargs,
    ) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(dro_step_size=dro_step_size, dro_smoothing=dro_smoothing)
        self.dro_step_size = dro_step_size
        self.dro_smoothing = dro_smoothing
        self.log_q = torch.zeros(num_tasks)

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        self.log_q[present] += self.dro_step_size * losses[present]
        q = torch.softmax(self.log_q.masked_fill(~present, -math.inf), dim=0)
        return (1 - self.dro_smoothing) * q + self.dro_smoothing * masked_uniform(present)

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "log_q": self.log_q}
