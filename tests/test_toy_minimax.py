"""The paper's Appendix C toy problem, optimised through the library's own strategies.

Task 1 is ``A (theta - 1)^2``, tasks 2..T are ``theta^2``. Derivations (ours):

* average: ``d/dtheta [A (theta-1)^2 + (T-1) theta^2] = 0``  ->  ``theta_avg = A / (A + T - 1)``;
* minimax: on [0, 1] the first loss decreases and the others increase, so the max is smallest where they cross,
  ``sqrt(A) (1 - theta) = theta``  ->  ``theta* = sqrt(A) / (1 + sqrt(A))`` with worst-case loss ``theta*^2``;
* worst case of the average solution: ``A ((T-1) / (A+T-1))^2`` (task 1 is the worst when ``A < (T-1)^2``), so the
  ratio of worst cases is ``((T-1)(1+sqrt(A)) / (A+T-1))^2``.
"""

import math

import pytest
import torch

from robust_pretrain.weighting import build_weighting

A, T = 4.0, 9
THETA_AVG = A / (A + T - 1)
THETA_STAR = math.sqrt(A) / (1 + math.sqrt(A))


def task_losses(theta: torch.Tensor) -> torch.Tensor:
    return torch.stack([A * (theta - 1) ** 2] + [theta**2] * (T - 1))


def worst_case(theta: float) -> float:
    return float(task_losses(torch.tensor(theta)).max())


def optimise(name: str, steps: int, lr: float = 0.1, decay: bool = True, **options) -> float:
    """Weighted gradient descent; returns the average iterate over the second half (the theorem's output)."""
    strategy = build_weighting(name, T, **options)
    theta = torch.tensor(0.0, requires_grad=True)
    present = torch.ones(T, dtype=torch.bool)
    tail = []
    for k in range(steps):
        losses = task_losses(theta)
        weights = strategy.weights(losses.detach(), present)
        (grad,) = torch.autograd.grad((weights * losses).sum(), theta)
        with torch.no_grad():
            theta -= (lr / math.sqrt(k + 1) if decay else lr) * grad
        if k >= steps // 2:
            tail.append(theta.item())
    return sum(tail) / len(tail)


def test_closed_forms_are_consistent():
    # the crossing point really equalises the two losses and the worst case is attained by task 1 at theta_avg
    assert A * (THETA_STAR - 1) ** 2 == pytest.approx(THETA_STAR**2)
    assert worst_case(THETA_AVG) == pytest.approx(A * ((T - 1) / (A + T - 1)) ** 2)


def test_average_converges_to_its_closed_form_minimiser():
    assert optimise("average", 500, lr=0.05, decay=False) == pytest.approx(THETA_AVG, abs=1e-5)


@pytest.mark.parametrize(("name", "options"), [("minimax", {"alpha": 1.0, "alpha_schedule": "sqrt"}), ("hardmax", {})])
def test_minimax_strategies_converge_to_the_minimax_point(name, options):
    theta = optimise(name, 4000, **options)
    assert theta == pytest.approx(THETA_STAR, abs=0.01)
    expected_ratio = ((T - 1) * (1 + math.sqrt(A)) / (A + T - 1)) ** 2
    assert worst_case(THETA_AVG) / worst_case(theta) == pytest.approx(expected_ratio, rel=0.05)
    assert expected_ratio == pytest.approx(4.0)  # A=4, T=9: the average's worst task is 4x worse


def test_sqrt_schedule_worst_case_gap_shrinks_like_one_over_sqrt_k():
    """Thm 3.1: the averaged iterate's worst-case gap is O(1/sqrt(K)); 4x the steps should roughly halve it."""
    optimum = THETA_STAR**2
    gap = {k: worst_case(optimise("minimax", k, alpha_schedule="sqrt")) - optimum for k in (500, 2000)}
    assert gap[500] > 0 and gap[2000] > 0
    assert gap[2000] < 0.65 * gap[500]


def test_constant_alpha_stops_short_of_the_minimax_point():
    """With a fixed alpha = 1 the method minimises the smooth max, whose minimiser lies between the two solutions."""
    theta = optimise("minimax", 2000, alpha=1.0)
    assert THETA_AVG + 0.05 < theta < THETA_STAR - 0.05
