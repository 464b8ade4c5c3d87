"""Dynamic Weight Average — Liu et al., *End-to-End Multi-Task Learning with Attention* (CVPR 2019).

``w_t = T * exp(r_t / tau) / sum_s exp(r_s / tau)``, ``r_t = Lbar_t(n-1) / Lbar_t(n-2)``, where ``Lbar_t(n)`` is task
t's mean loss over window n. The paper's windows are epochs; pre-training has few epochs, so windows here are
``dwa_window`` optimizer steps. The first two windows use uniform weights; a task not seen in both previous windows has
``r_t = 1``. The weights are returned without the paper's factor T: they sum to 1 over the present tasks (the
paper's sum to T).
"""

from __future__ import annotations

import math

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting


class DWAWeighting(Weighting):
    """DWA with temperature ``dwa_temperature`` (tau, default 2.0) over windows of ``dwa_window`` steps."""

    def __init__(
        self,
        num_tasks: int,
        dwa_temperature: float = DEFAULTS.dwa_temperature,
        dwa_window: int = DEFAULTS.dwa_window,
        **kwargs,
    ) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(dwa_temperature=dwa_temperature, dwa_window=dwa_window)
        self.dwa_temperature = dwa_temperature
        self.dwa_window = dwa_window
        self.window_sum = torch.zeros(num_tasks)
        self.window_count = torch.zeros(num_tasks)
        self.previous_means = torch.full((2, num_tasks), math.nan)  # rows: window n-2, window n-1

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        if self.step > 0 and self.step % self.dwa_window == 0:
            means = torch.where(self.window_count > 0, self.window_sum / self.window_count.clamp_min(1), math.nan)
            self.previous_means = torch.stack([self.previous_means[1], means])
            self.window_sum.zero_()
            self.window_count.zero_()
        self.window_sum[present] += losses[present]
        self.window_count[present] += 1
        ratios = self.previous_means[1] / self.previous_means[0]
        ratios = torch.where(ratios.isfinite(), ratios, torch.ones_like(ratios))
        logits = (ratios / self.dwa_temperature).masked_fill(~present, -math.inf)
        return torch.softmax(logits, dim=0)

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {
            **super()._tensor_state(),
            "window_sum": self.window_sum,
            "window_count": self.window_count,
            "previous_means": self.previous_means,
        }
