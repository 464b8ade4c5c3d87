"""GradNorm — Chen et al., *GradNorm: Gradient Normalization for Adaptive Loss Balancing in Deep Multitask Networks*
(ICML 2018).

Learnable weights ``w`` (initialised to 1, renormalised to sum to T before each step). With ``g_t`` the norm of the
gradient of ``L_t`` w.r.t. the parameters of a shared module W (default: the last shared encoder layer),
``G_t = w_t * g_t``, ``Gbar = mean_t G_t``, the relative inverse training rate ``r_t = Ltilde_t / mean(Ltilde)`` with
``Ltilde_t = L_t / L_t(0)``, and the constant targets ``G_t* = Gbar * r_t ** alpha``, the weights follow the gradient of
``L_grad = sum_t |G_t - G_t*|``: ``dL_grad/dw_t = sign(G_t - G_t*) * g_t``. The trainer's optimizer applies that
gradient. Only tasks whose ``g_t`` was measured at the step (present in its first micro-batch) enter ``Gbar``, ``r_t``
and the gradient; another present task keeps its ``w_t``.

The task losses are weighted by ``w_t / T``, and ``w`` is renormalised to sum to T over all T tasks before each step,
so the weights sum to ``sum_{t in P} w_t / T``: 1 when every task is present, less when some are absent.
"""

from __future__ import annotations

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting


class GradNormWeighting(Weighting):
    """GradNorm with asymmetry ``gradnorm_alpha`` (default 1.5)."""

    loss_driven = False
    needs_grad_norms = True

    def __init__(self, num_tasks: int, gradnorm_alpha: float = DEFAULTS.gradnorm_alpha, **kwargs) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(gradnorm_alpha=gradnorm_alpha)
        self.gradnorm_alpha = gradnorm_alpha
        self.task_weights = torch.nn.Parameter(torch.ones(num_tasks))
        self.last_target_norms = torch.zeros(num_tasks)

    def _weights(self, losses: torch.Tensor, present: torch.Tensor, grad_norms: torch.Tensor | None) -> torch.Tensor:
        if grad_norms is None or grad_norms.shape != (self.num_tasks,):
            raise ValueError(f"GradNorm needs grad_norms of shape ({self.num_tasks},), got {grad_norms!r}")
        with torch.no_grad():
            w = self.task_weights.clamp_min(1e-6)
            self.task_weights.copy_(w * self.num_tasks / w.sum())
        w = self.task_weights.detach().cpu()
        g = grad_norms.detach().float().cpu()
        balanced = present & g.isfinite()  # tasks whose norm (and loss) was measured at this step
        g = torch.where(balanced, g, 0.0)
        relative = torch.where(balanced, losses / self.initial_losses, 0.0)
        inverse_rate = relative / relative[balanced].mean() if balanced.any() else relative
        norms = w * g
        mean_norm = norms[balanced].mean() if balanced.any() else 0.0
        targets = torch.where(balanced, mean_norm * inverse_rate.pow(self.gradnorm_alpha), 0.0)
        self.last_target_norms = targets
        grad = torch.where(balanced, torch.sign(norms - targets) * g, 0.0)
        if self.task_weights.grad is None:
            self.task_weights.grad = torch.zeros_like(self.task_weights)
        self.task_weights.grad += grad.to(self.task_weights.device)
        return torch.where(present, w, 0.0) / self.num_tasks

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.task_weights]

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "task_weights": self.task_weights}
