"""Importance weighting (issue 39): the expected objective weights over every batch a fixed ``q`` can draw equal the
objective's ``w``, computed by enumerating every batch composition; sampling weights that never draw a task are
refused; sampling weights that do not sum to 1 are normalised."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from robust_pretrain import MinimaxTrainingArguments
from robust_pretrain.trainer.task_sampling import (
    FixedWeighting,
    ImportanceWeighting,
    TaskSamplingSchedule,
    TaskSamplingWeighting,
)
from robust_pretrain.weighting import build_weighting

Q = [0.6, 0.3, 0.1]
LOSSES = [2.0, 1.0, 3.0]
TARGETS_PER_SEQUENCE = 5


def compositions(batch: int, q: list[float]) -> list[tuple[float, np.ndarray]]:
    """Every count vector of ``batch`` sequences over the tasks, with its multinomial probability under ``q``."""
    out = []
    for counts in itertools.product(range(batch + 1), repeat=len(q)):
        if sum(counts) != batch:
            continue
        ways = math.factorial(batch) / math.prod(math.factorial(c) for c in counts)
        out.append((ways * math.prod(p**c for p, c in zip(q, counts, strict=True)), np.array(counts)))
    return out


def expected_weights(weighting: ImportanceWeighting, batch: int) -> np.ndarray:
    """``sum_c P(c) * weights(c)``: the step's objective weights averaged over every batch ``q`` can draw, each task's
    loss the same whatever the batch (the expectation over the draws, for given losses)."""
    total = np.zeros(len(Q))
    for probability, counts in compositions(batch, Q):
        step = copy.deepcopy(weighting)
        task_counts = torch.tensor(counts * TARGETS_PER_SEQUENCE, dtype=torch.float32)
        w = step.weights(torch.tensor(LOSSES), torch.tensor(counts > 0), task_counts=task_counts)
        total += probability * w.double().numpy()
    return total


def seen_every_task(objective_name: str, **options) -> ImportanceWeighting:
    """The importance weighting of ``objective_name`` after a first step that measured every task at ``LOSSES``."""
    weighting = ImportanceWeighting(build_weighting(objective_name, len(Q), **options), Q)
    weighting.weights(torch.tensor(LOSSES), torch.ones(len(Q), dtype=torch.bool), task_counts=torch.ones(len(Q)))
    return weighting


@pytest.mark.parametrize("batch", [6, 16])
def test_a_loss_driven_objective_gets_its_weights_in_expectation_when_domains_can_be_absent(batch):
    """minimax (alpha 1): ``w = softmax(L)`` = (0.2447, 0.0900, 0.6652); batches of 6 miss the rare task (q 0.1) with
    probability 0.9^6 = 0.53. Weighing only the drawn tasks (the old rule) renormalises w over them: the expected
    weights were (0.555, 0.198, 0.679) at batch 6 (0.43 off in total) and (0.345, 0.127, 0.666) at batch 16."""
    weighting = seen_every_task("minimax", alpha=1.0)
    want = np.exp(LOSSES) / np.exp(LOSSES).sum()
    assert want == pytest.approx([0.244728, 0.090031, 0.665241], abs=1e-6)
    assert len(compositions(batch, Q)) == math.comb(batch + 2, 2)
    assert expected_weights(weighting, batch) == pytest.approx(want, abs=1e-6)


def test_group_dro_as_the_objective_gets_its_weights_in_expectation():
    """group_dro's step from its state: ``q_t <- q_t exp(eta L_t)``, normalised; from uniform after a first step
    with every loss measured (no smoothing), the second step's weights are ``exp(2 eta L) / sum`` whatever the batch
    drew."""
    weighting = seen_every_task("group_dro", dro_step_size=0.5, dro_smoothing=0.0)
    step = copy.deepcopy(weighting)
    want = step.objective.weights(torch.tensor(LOSSES), torch.ones(len(Q), dtype=torch.bool)).double().numpy()
    assert want == pytest.approx(np.exp(np.array(LOSSES)) / np.exp(np.array(LOSSES)).sum(), abs=1e-6)
    assert expected_weights(weighting, 6) == pytest.approx(want, abs=1e-6)


def test_fixed_objective_weights_are_exact_in_expectation():
    weighting = ImportanceWeighting(FixedWeighting(len(Q), [0.2, 0.2, 0.6]), Q)
    assert expected_weights(weighting, 6) == pytest.approx([0.2, 0.2, 0.6], abs=1e-6)  # float32 weights


def test_sampling_weights_that_do_not_sum_to_one_are_normalised():
    """q = (2, 6) is q = (0.25, 0.75): with N = (1, 3) targets and w = (0.5, 0.5) the weights are
    (w_t / q_t) N_t / N = (0.5 / 0.25 * 1 / 4, 0.5 / 0.75 * 3 / 4) = (0.5, 0.5)."""
    weighting = ImportanceWeighting(FixedWeighting(2, [1.0, 1.0]), [2.0, 6.0])
    assert weighting.sampling_weights.tolist() == pytest.approx([0.25, 0.75])
    both = torch.ones(2, dtype=torch.bool)
    w = weighting.weights(torch.tensor([1.0, 1.0]), both, task_counts=torch.tensor([1.0, 3.0]))
    assert w.tolist() == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("q", [[0.0, 1.0, 1.0], [1e-30, 1.0, 1.0], [1e-4, 1.0, 1.0]])
def test_sampling_weights_that_never_draw_a_task_are_refused(tmp_path, q):
    """A task drawn with q_t * T < 1e-3 is (almost) never drawn and would leave the objective: refused in Python, by
    the arguments (task names known or not) and by the weighting itself; q_t * T = 1e-3 is accepted."""
    with pytest.raises(ValueError, match="task 0: .* is below 0.000333"):
        ImportanceWeighting(FixedWeighting(3, [1.0, 1.0, 1.0]), q)
    options = dict(output_dir=str(tmp_path), task_sampling="fixed", importance_weighting=True, use_cpu=True)
    with pytest.raises(ValueError, match="task_sampling_weights: importance weighting draws every task, but a: "):
        MinimaxTrainingArguments(**options, task_sampling_weights=q, task_names=["a", "b", "c"])
    args = MinimaxTrainingArguments(**options)
    args.task_sampling_weights = q  # as a recipe sets them from a file
    with pytest.raises(ValueError, match="but b: "):
        args.bind_tasks(["b", "c", "d"])
    share = 1.0001e-3 / 3  # just above the floor once normalised: q_0 / (q_0 + 2) = share
    ImportanceWeighting(FixedWeighting(3, [1.0, 1.0, 1.0]), [2 * share / (1 - share), 1.0, 1.0])


@pytest.mark.parametrize(
    "options", [{"task_sampling": "online"}, {"task_sampling": "fixed", "importance_weighting": True}]
)
def test_proportional_weights_cannot_drive_sampling(tmp_path, options):
    """``proportional`` weights are the batch's own shares: drawing by them (or correcting toward them) feeds the
    draws back into the weights."""
    weights = {"task_sampling_weights": [1.0, 1.0]} if options["task_sampling"] == "fixed" else {}
    with pytest.raises(ValueError, match="weighting='proportional' cannot drive task sampling: .*own task shares"):
        MinimaxTrainingArguments(str(tmp_path), weighting="proportional", use_cpu=True, **options, **weights)
    with pytest.raises(ValueError, match="ProportionalWeighting cannot drive task sampling"):
        TaskSamplingWeighting(build_weighting("proportional", 2), TaskSamplingSchedule(2))
