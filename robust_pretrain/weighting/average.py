"""Uniform average of the task losses — the paper's eq. (4) baseline: ``w_t = 1 / |P|`` over the present tasks P.

The weights sum to 1 over P; the objective is the mean of the per-task means, not the per-token mean of standard
masked-LM training (that is :class:`~robust_pretrain.weighting.proportional.ProportionalWeighting`).
"""

from __future__ import annotations

import torch

from .base import Weighting, masked_uniform


class AverageWeighting(Weighting):
    """Plain multi-task average (Wang et al., eq. 4): every task present in the step gets the same weight."""

    loss_driven = False

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return masked_uniform(present)
