"""The epoch cap of online sampling (``--max_epochs_per_task``,
:class:`~robust_pretrain.trainer.task_sampling.EpochCap`): the draws counted exactly as the collator makes them, a
capped domain drawn no more, a resumed run capped as an uninterrupted one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from robust_pretrain.data.domains import DomainCollator
from robust_pretrain.trainer.task_sampling import EpochCap, TaskSamplingSchedule
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

SEQUENCES = [3, 40, 100]  # domain 0 is tiny: 2 epochs are 6 draws
SAMPLER = torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)  # stands in for minimax's weights, favouring domain 0
BATCH = 8


def drawing(seed: int = 7) -> tuple[DomainCollator, TaskSamplingSchedule]:
    schedule = TaskSamplingSchedule(len(SEQUENCES))
    collator = DomainCollator(pad_token_id=0)
    collator._rows_by_domain = [torch.arange(count) for count in SEQUENCES]
    args = SimpleNamespace(seed=seed, per_device_train_batch_size=BATCH // 2, process_index=0, world_size=2)
    collator.bind_draws(schedule, args)
    return collator, schedule


def train(collator, schedule, cap, steps: range, drawn: torch.Tensor, per_step: list) -> None:
    """Each step: the collator draws its batch (the weights of step - 2), then the capped weights are published."""
    for step in steps:
        drawn_step, _, domains, _ = collator.global_draw()
        assert drawn_step == step
        counts = torch.bincount(domains, minlength=len(SEQUENCES)).double()
        drawn += counts
        per_step.append(counts)
        schedule.publish(step, cap.apply(step, SAMPLER, schedule))


def capped(collator) -> EpochCap:
    return EpochCap(2.0, collator.domain_sequences(), lambda step, w: collator.step_draw_counts(step, w, 1))


def test_the_cap_counts_the_draws_exactly_and_closes_the_domain():
    collator, schedule = drawing()
    cap, drawn, per_step = capped(collator), torch.zeros(3, dtype=torch.float64), []
    train(collator, schedule, cap, range(1, 16), drawn, per_step)
    # the cap's count of the trained steps is the collator's own draws, exactly
    assert cap.epochs() == pytest.approx((drawn / torch.tensor(SEQUENCES)).tolist(), abs=0)
    # domain 0 reached 2 epochs (6 draws), overshooting by less than the step that crossed it, then never again
    crossed = next(i for i in range(len(per_step)) if sum(c[0] for c in per_step[: i + 1]) >= 6)
    assert 6 <= drawn[0] < 6 + BATCH
    assert all(counts[0] == 0 for counts in per_step[crossed + 1 :]) and crossed + 1 < len(per_step)
    # its weight 0, the others renormalised: 0.2 / 0.5 and 0.3 / 0.5
    assert drawn[1] < 80 and schedule.weights_at(15).tolist() == pytest.approx([0.0, 0.4, 0.6])


def test_a_resumed_run_caps_as_an_uninterrupted_one():
    collator, schedule = drawing()
    cap, whole, per_step = capped(collator), torch.zeros(3, dtype=torch.float64), []
    train(collator, schedule, cap, range(1, 21), whole, per_step)
    first_collator, first_schedule = drawing()
    first, drawn = capped(first_collator), torch.zeros(3, dtype=torch.float64)
    train(first_collator, first_schedule, first, range(1, 9), drawn, [])
    state, history = first.state_dict(), first_schedule.state_dict()
    again_collator, again_schedule = drawing()  # a new process: the checkpoint's state restored
    again_schedule.load_state_dict(history)
    again_schedule.start_epoch(9, 1)
    again = capped(again_collator)
    again.load_state_dict(state)
    train(again_collator, again_schedule, again, range(9, 21), drawn, [])
    assert again.epochs() == cap.epochs() and torch.equal(drawn, whole)
    assert again_schedule.weights_at(20).tolist() == schedule.weights_at(20).tolist()


def test_the_cap_is_for_online_sampling_only(tmp_path):
    with pytest.raises(ValueError, match="max_epochs_per_task: caps the draws of task_sampling='online'"):
        MinimaxTrainingArguments(str(tmp_path), weighting="minimax", max_epochs_per_task=2.0)
    args = MinimaxTrainingArguments(str(tmp_path), weighting="minimax", task_sampling="online", max_epochs_per_task=2.0)
    assert args.max_epochs_per_task == 2.0
