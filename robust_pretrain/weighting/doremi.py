"""DoReMi's domain weights — Algorithm 1 of Xie et al., *DoReMi: Optimizing Data Mixtures Speeds Up Language Model
Pretraining* (NeurIPS 2023), step 2 (the proxy's Group DRO over domains).

With ``lambda_t`` the step's excess loss of every domain (``loss_normalization='excess'``; with a ``reference_model``
and ``excess_clipping='token'``, DoReMi's ``mean over the domain's tokens of max(l_proxy - l_ref, 0)``), step size
``eta`` (``dro_step_size``) and smoothing ``c`` (``dro_smoothing``), ``T`` domains:

    ``alpha'_t = alpha_{t-1} * exp(eta * lambda_t)``,  ``alpha_t = (1 - c) * alpha'_t / sum(alpha'_t) + c / T``,

from ``alpha_0 = 1 / T``. The update starts from the *smoothed* weights of the previous step (the smoothing compounds,
as in DoReMi's code) and weighs **every** domain at every step (``weigh_absent_tasks``, always on): a domain absent
from the step keeps its last excess estimate (one never measured: the largest current one), so the returned weights
are the full vector
``alpha_t`` (absent domains included; they sum to 1) and its time average is DoReMi's output ``mean_t alpha_t``.
Unlike :class:`~robust_pretrain.weighting.group_dro.GroupDROWeighting` (Sagawa et al.), absence neither zeroes a
domain's weight nor skips its update.
"""

from __future__ import annotations

import math

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting


class DoReMiWeighting(Weighting):
    """Exponentiated-gradient domain weights over all domains, step ``dro_step_size`` (eta), smoothing
    ``dro_smoothing`` (c), updated from the smoothed weights."""

    def __init__(
        self,
        num_tasks: int,
        dro_step_size: float = DEFAULTS.dro_step_size,
        dro_smoothing: float = DEFAULTS.dro_smoothing,
        **kwargs,
    ) -> None:
        super().__init__(num_tasks, **kwargs)
        self.weigh_absent_tasks = True  # Algorithm 1 updates every domain at every step, whatever the option says
        check_weighting_options(dro_step_size=dro_step_size, dro_smoothing=dro_smoothing)
        self.dro_step_size = dro_step_size
        self.dro_smoothing = dro_smoothing
        #: ``log alpha_{t-1}``, the smoothed weights of the last step (``log(1 / T)`` before the first)
        self.log_alpha = torch.full((num_tasks,), -math.log(num_tasks))

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        updated = torch.softmax(self.log_alpha.double() + self.dro_step_size * losses.double(), dim=0)
        alpha = (1 - self.dro_smoothing) * updated + self.dro_smoothing / self.num_tasks
        self.log_alpha = alpha.log().float()
        return alpha.float()

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "log_alpha": self.log_alpha}
