"""MORBiT — projected gradient ascent of the task weights on the simplex.

Gu et al., *Min-Max Multi-objective Bilevel Optimization with Applications in Robust Machine Learning* (ICLR 2023):
``lambda <- proj_simplex(lambda + gamma * L)``, with the exact Euclidean projection onto the probability simplex
(the sort-based algorithm of Held et al. 1974 / Duchi et al. 2008), applied to the present tasks' entries: their
weights sum to 1. Absent tasks keep their lambda and get no weight.
"""

from __future__ import annotations

import torch

from .arguments import DEFAULTS, check_weighting_options
from .base import Weighting


def project_to_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of a finite vector onto ``{x : x >= 0, sum x = 1}``, in the dtype of ``v``.

    Computed in float64 on ``v - max(v)`` (the projection is unchanged by adding a constant to every entry), so the
    largest entry always satisfies the support condition exactly, whatever the magnitude of ``v``.
    """
    if v.dim() != 1 or v.numel() == 0:
        raise ValueError(f"project_to_simplex needs a non-empty vector, got shape {tuple(v.shape)}")
    if not torch.isfinite(v).all():
        raise ValueError(f"project_to_simplex needs finite values, got {v.tolist()}")
    shifted = v.double() - v.double().max()
    u, _ = torch.sort(shifted, descending=True)
    cumulative = torch.cumsum(u, dim=0) - 1.0
    k = torch.arange(1, v.numel() + 1, dtype=torch.float64)
    # the support is u[:rho + 1]; index 0 always belongs to it (u[0] = 0, cumulative[0] = -1)
    rho = int(torch.nonzero(u - cumulative / k > 0).max())
    theta = cumulative[rho] / (rho + 1)
    return (shifted - theta).clamp_min(0.0).to(v.dtype)


class MorbitWeighting(Weighting):
    """Projected ascent ``lambda <- proj(lambda + morbit_step_size * L)``, starting from the uniform vector."""

    def __init__(self, num_tasks: int, morbit_step_size: float = DEFAULTS.morbit_step_size, **kwargs) -> None:
        super().__init__(num_tasks, **kwargs)
        check_weighting_options(morbit_step_size=morbit_step_size)
        self.morbit_step_size = morbit_step_size
        self.lam = torch.full((num_tasks,), 1.0 / num_tasks)

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        self.lam[present] = project_to_simplex(self.lam[present] + self.morbit_step_size * losses[present])
        return torch.where(present, self.lam, torch.zeros_like(self.lam))

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        return {**super()._tensor_state(), "lam": self.lam}
