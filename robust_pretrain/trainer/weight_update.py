"""When a step's weights are known before its first forward pass: loss-free strategies, and the simultaneous order.

``weight_update='alternating'`` (the default) weighs step k by the losses of its own first micro-batch: first the
weights' ascent step on ``L(theta_k)``, then the model's descent step at the new weights. ``'simultaneous'`` weighs
step k by the losses measured at step k-1 (``w_k = f(L(theta_{k-1}))``), so both players move from the same point.
Under the simultaneous order, and for strategies whose weights never depend on the losses, every target's weight in
the objective is known before the forward pass, and the chunked loss computes the head's gradients in it
(:mod:`~robust_pretrain.trainer.single_pass_loss`).
"""

from __future__ import annotations

import torch

from ..weighting import Weighting
from ..weighting.average import AverageWeighting
from ..weighting.base import masked_uniform
from .task_sampling import FixedWeighting, ImportanceWeighting


def loss_free_weights(weighting: Weighting, present: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
    """The weights ``weighting.weights`` will return at this step when they do not depend on the losses (on the
    device of ``present``, the step's tasks, and ``counts``, their target counts), else ``None``: ``proportional``
    (and online sampling's objective) ``N_t / N``, ``average``, fixed weights, ``uncertainty``'s ``exp(-s_t) / 2``,
    and ``w_t / q_t * N_t / N`` of importance weighting over one of those."""
    present = present.bool()
    if isinstance(weighting, ImportanceWeighting):
        target = loss_free_weights(weighting.objective, present, counts)
        if target is None:
            return None
        q = weighting.sampling_weights.to(counts.device)
        ratio = torch.where(q > 0, target / q.clamp_min(torch.finfo(q.dtype).tiny), 0.0)
        return ratio * _shares(present, counts)
    if weighting.loss_driven or weighting.needs_grad_norms:
        return None
    if weighting.needs_task_counts:
        return _shares(present, counts)
    if weighting.parameters():
        return weighting.differentiable_weights(present.float(), present).detach()
    if isinstance(weighting, FixedWeighting):
        return torch.where(present, weighting.task_weights.to(counts.device), 0.0)
    return masked_uniform(present) if isinstance(weighting, AverageWeighting) else None


def _shares(present: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``N_t / N`` over the present tasks (0 where none is)."""
    counts = torch.where(present, counts.float(), 0.0)
    return counts / counts.sum().clamp_min(1)
