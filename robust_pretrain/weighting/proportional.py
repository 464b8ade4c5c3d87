"""Proportional weights — the standard masked-LM objective, the mean loss over all targets (Devlin et al., *BERT:
Pre-training of Deep Bidirectional Transformers for Language Understanding*, NAACL 2019).

``w_t = N_t / sum_{s in P} N_s``, where ``N_t`` is the number of targets of task t in the optimizer step (all
micro-batches, all processes). With the task means ``L_t = S_t / N_t`` the objective is
``sum_t w_t L_t = sum_t S_t / N``: exactly the plain per-token mean loss (the ``Trainer`` on ``BertForMaskedLM`` with
the same targets). Frequent tasks weigh more; :class:`~robust_pretrain.weighting.average.AverageWeighting` (Wang et
al., eq. 4) instead gives every task the same weight. The weights sum to 1 over the present tasks.
"""

from __future__ import annotations

import torch

from .base import Weighting


class ProportionalWeighting(Weighting):
    """``w_t = N_t / N``: each present task's share of the step's targets (the losses play no part)."""

    loss_driven = False
    needs_task_counts = True

    def _weights(self, losses: torch.Tensor, present: torch.Tensor, task_counts: torch.Tensor) -> torch.Tensor:
        counts = torch.where(present, task_counts, 0.0)
        return counts / counts.sum()
