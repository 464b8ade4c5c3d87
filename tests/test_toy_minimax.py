"""The paper's Appendix C toy problem, optimised through the library's own strategies.

Task 1 is ``A (theta - 1)^2``, tasks 2..T are ``theta^2``. Derivations (ours):

* average: ``d/dtheta [A (theta-1)^2 + (T-1) theta^2] = 0``  ->  ``theta_avg = A / (A + T - 1)``;
* minimax: on [0, 1] the first loss decreases and the others increase, so the max is smallest where they cross,
  ``sqrt(A) (1 - theta) = theta``  ->  ``theta* = sqrt(A) / (1 + sqrt(A))`` with worst-case loss ``theta*^2``;
* the paper's App. C prints ``theta*_max = sqrt(A) / (sqrt(A) - 1)``: that is the other crossing of
  ``|sqrt(A) (theta - 1)| = |theta|`` (``sqrt(A) (theta - 1) = theta``, outside [0, 1] for A > 1), a sign error; the
  optimum of the worst case is ``sqrt(A) / (sqrt(A) + 1)`` as derived above and asserted below;
* worst case of the average solution: ``A ((T-1) / (A+T-1))^2`` (task 1 is the worst when ``A < (T-1)^2``), so the
  ratio of worst cases is ``((T-1)(1+sqrt(A)) / (A+T-1))^2``.

The last tests train the toy model through ``MinimaxTrainer`` (plain SGD) and compare every step's weights and
iterate with an independent float64 numpy re-implementation of each strategy's rule, written from its paper's
definition: they catch a wrong constant (alpha scaled) or a flipped update sign, which the convergence tests above do
not (the sqrt schedule still converges with alpha halved).
"""

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.weighting import build_weighting

A, T = 4.0, 9
THETA_AVG = A / (A + T - 1)
THETA_STAR = math.sqrt(A) / (1 + math.sqrt(A))


def task_losses(theta: torch.Tensor) -> torch.Tensor:
    return torch.stack([A * (theta - 1) ** 2] + [theta**2] * (T - 1))


def worst_case(theta: float) -> float:
    return float(task_losses(torch.tensor(theta)).max())


def optimise(
    name: str, steps: int, lr: float = 0.1, decay: bool = True, order: str = "alternating", **options
) -> float:
    """Weighted gradient descent; returns the average iterate over the second half (the theorem's output).
    ``order='simultaneous'``: the weights of step k from the losses of step k-1 (none observed at step 0)."""
    strategy = build_weighting(name, T, **options)
    theta = torch.tensor(0.0, requires_grad=True)
    present = torch.ones(T, dtype=torch.bool)
    tail, previous = [], None
    for k in range(steps):
        losses = task_losses(theta)
        if order == "alternating":
            weights = strategy.weights(losses.detach(), present)
        else:
            seen = present if previous is not None else torch.zeros(T, dtype=torch.bool)
            weights = strategy.weights(previous if previous is not None else torch.zeros(T), present, seen)
            previous = losses.detach()
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


@pytest.mark.slow
@pytest.mark.parametrize("order", ["alternating", "simultaneous"])
@pytest.mark.parametrize(("name", "options"), [("minimax", {"alpha": 1.0, "alpha_schedule": "sqrt"}), ("hardmax", {})])
def test_minimax_strategies_converge_to_the_minimax_point(name, options, order):
    theta = optimise(name, 4000, order=order, **options)
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


# ------------------------------------------------------------------------------ end to end through MinimaxTrainer
TOY_TASKS = [f"task{t}" for t in range(T)]
TOY_STEPS, TOY_LR = 30, 0.05


class ToyModel(torch.nn.Module):
    """The toy problem as a model returning ``task_losses``; ``theta`` starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> dict:
        losses = task_losses(self.theta)
        return {"task_losses": dict(zip(TOY_TASKS, losses, strict=True))}


class Trajectory(TrainerCallback):
    def __init__(self, trainer: MinimaxTrainer) -> None:
        self.trainer, self.weights, self.thetas = trainer, [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.weights.append(self.trainer.step_weights.double().numpy().copy())
        self.thetas.append(self.trainer.model.theta.item())


def train_toy(tmp_path, weighting: str, **options) -> Trajectory:
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path), task_names=TOY_TASKS, weighting=weighting, **options, optim="sgd",
        learning_rate=TOY_LR, lr_scheduler_type="constant", max_steps=TOY_STEPS, per_device_train_batch_size=1,
        max_grad_norm=0.0, weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    data = Dataset.from_dict({"x": [0.0] * TOY_STEPS})
    trainer = MinimaxTrainer(model=ToyModel(), args=args, train_dataset=data)
    trajectory = Trajectory(trainer)
    trainer.add_callback(trajectory)
    trainer.train()
    return trajectory


def numpy_losses(theta: float) -> np.ndarray:
    return np.array([A * (theta - 1) ** 2] + [theta**2] * (T - 1))


def numpy_gradients(theta: float) -> np.ndarray:
    return np.array([2 * A * (theta - 1)] + [2 * theta] * (T - 1))


def numpy_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def numpy_simplex_projection(v: np.ndarray) -> np.ndarray:
    """argmin_{x in simplex} ||x - v||: x = max(v - tau, 0) with tau found by bisection on sum(x) = 1."""
    low, high = v.min() - 1.0, v.max()
    for _ in range(200):
        tau = (low + high) / 2
        low, high = (tau, high) if np.maximum(v - tau, 0).sum() > 1 else (low, tau)
    return np.maximum(v - (low + high) / 2, 0)


def reference_trajectory(rule) -> tuple[list[np.ndarray], list[float]]:
    """SGD ``theta <- theta - lr * sum_t w_t dL_t/dtheta`` with ``w = rule(k, L(theta_k))``, in float64."""
    theta, weights, thetas = 0.0, [], []
    for k in range(TOY_STEPS):
        w = rule(k, numpy_losses(theta))
        theta -= TOY_LR * float(w @ numpy_gradients(theta))
        weights.append(w)
        thetas.append(theta)
    return weights, thetas


def minimax_rule(alpha: float, schedule: str):
    """Algorithm 1: ``w = softmax(alpha_k L)``, ``alpha_k = alpha`` or ``alpha sqrt(k + 1)``."""
    return lambda k, losses: numpy_softmax((alpha * math.sqrt(k + 1) if schedule == "sqrt" else alpha) * losses)


def group_dro_rule(step_size: float, smoothing: float):
    """Sagawa et al. Alg. 1: ``q <- q * exp(eta L)`` normalised; DoReMi's smoothing ``(1 - eps) q + eps / T``."""
    log_q = np.zeros(T)

    def rule(k, losses):
        log_q[:] += step_size * losses
        return (1 - smoothing) * numpy_softmax(log_q) + smoothing / T

    return rule


def morbit_rule(step_size: float):
    """MORBiT: ``lambda <- proj_simplex(lambda + gamma L)`` from the uniform vector."""
    lam = np.full(T, 1 / T)

    def rule(k, losses):
        lam[:] = numpy_simplex_projection(lam + step_size * losses)
        return lam.copy()

    return rule


@pytest.mark.parametrize(
    ("weighting", "options", "rule"),
    [
        ("minimax", {"alpha": 0.5}, minimax_rule(0.5, "constant")),
        ("minimax", {"alpha": 0.2, "alpha_schedule": "sqrt"}, minimax_rule(0.2, "sqrt")),
        ("group_dro", {"dro_step_size": 0.1, "dro_smoothing": 0.01}, group_dro_rule(0.1, 0.01)),
        ("morbit", {"morbit_step_size": 0.05}, morbit_rule(0.05)),
    ],
    ids=["minimax-constant", "minimax-sqrt", "group_dro", "morbit"],
)
def test_trainer_trajectory_equals_an_independent_reimplementation(tmp_path, weighting, options, rule):
    trained = train_toy(tmp_path, weighting, **options)
    weights, thetas = reference_trajectory(rule)
    assert len(trained.weights) == TOY_STEPS
    assert np.abs(np.array(trained.weights) - np.array(weights)).max() <= 1e-5
    assert np.abs(np.array(trained.thetas) - np.array(thetas)).max() <= 1e-5
    # the first step by hand: theta = 0, L = (A, 0, ..., 0)
    if weighting == "minimax":
        e = math.exp(A * options["alpha"])
        first = np.array([e] + [1.0] * (T - 1)) / (e + T - 1)
    elif weighting == "group_dro":
        e, eps = math.exp(A * options["dro_step_size"]), options["dro_smoothing"]
        first = (1 - eps) * np.array([e] + [1.0] * (T - 1)) / (e + T - 1) + eps / T
    else:  # lambda + gamma L sums to 1 + gamma A: the projection subtracts gamma A / T, every entry stays positive
        gamma = options["morbit_step_size"]
        first = np.array([1 / T + gamma * A] + [1 / T] * (T - 1)) - gamma * A / T
    assert np.abs(trained.weights[0] - first).max() <= 1e-6


def simultaneous(rule):
    """The same rule under ``weight_update='simultaneous'``: step k weighed by step k-1's losses (step 0: none
    observed, every estimate 0)."""
    previous = [np.zeros(T)]

    def delayed(k, losses):
        w = rule(k, previous[0])
        previous[0] = losses
        return w

    return delayed


@pytest.mark.parametrize(
    ("weighting", "options", "rule"),
    [
        ("minimax", {"alpha": 0.5}, minimax_rule(0.5, "constant")),
        ("group_dro", {"dro_step_size": 0.1, "dro_smoothing": 0.01}, group_dro_rule(0.1, 0.01)),
    ],
    ids=["minimax", "group_dro"],
)
def test_simultaneous_trajectory_equals_an_independent_reimplementation(tmp_path, weighting, options, rule):
    trained = train_toy(tmp_path, weighting, weight_update="simultaneous", **options)
    weights, thetas = reference_trajectory(simultaneous(rule))
    assert np.abs(trained.weights[0] - 1 / T).max() <= 1e-6  # nothing observed yet: uniform
    assert np.abs(np.array(trained.weights) - np.array(weights)).max() <= 1e-5
    assert np.abs(np.array(trained.thetas) - np.array(thetas)).max() <= 1e-5


@pytest.mark.parametrize("order", ["alternating", "simultaneous"])
def test_both_orders_reach_the_minimax_point_with_group_dro(order):
    """Exponentiated-gradient weights (group DRO / DoReMi) and gradient descent, averaged iterates: the same optimum
    ``sqrt(A) / (1 + sqrt(A))`` whichever player moves first."""
    theta = optimise("group_dro", 3000, lr=0.05, order=order, dro_step_size=0.5, dro_smoothing=0.0)
    assert theta == pytest.approx(THETA_STAR, abs=0.01)
