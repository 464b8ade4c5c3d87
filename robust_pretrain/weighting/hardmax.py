"""Hard maximum — the subgradient of ``max_t L_t``: all weight on the worst present task, ties split evenly.

This is the alpha -> infinity limit of :class:`~robust_pretrain.weighting.minimax.MinimaxWeighting`. The weights sum
to 1 over the present tasks.
"""

from __future__ import annotations

import math

import torch

from .base import Weighting


class HardmaxWeighting(Weighting):
    """``w_t = 1/|argmax| if t in argmax_{s in P} L_s else 0``."""

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        masked = losses.masked_fill(~present, -math.inf)
        worst = (masked == masked.max()) & present
        return worst.float() / worst.sum()
