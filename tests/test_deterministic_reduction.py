"""``--full_determinism``: the per-task sums by a fixed-order reduction (a one-hot product) instead of scatter-adds,
whose atomic adds on a GPU sum in no fixed order; the same numbers either way."""

import pytest
import torch
from test_trainer import make_args, one_step
from tiny_training import masked_examples, tiny_bert

from robust_pretrain import MinimaxTrainer
from robust_pretrain.task_losses import reduce_by_task
from robust_pretrain.trainer import objective as objective_module


@pytest.mark.parametrize("deterministic", [False, True])
def test_sums_and_counts_per_task(deterministic):
    losses = torch.tensor([1.0, 2.0, 3.0, 4.5])
    sums, counts = reduce_by_task(losses, torch.tensor([0, 2, 0, 1]), 4, deterministic)
    assert sums.tolist() == [4.0, 4.5, 2.0, 0.0] and counts.tolist() == [2.0, 1.0, 1.0, 0.0]


def test_both_reductions_agree_on_many_targets():
    generator = torch.Generator().manual_seed(0)
    losses = torch.rand(10_000, generator=generator) * 10
    ids = torch.randint(0, 7, (10_000,), generator=generator)
    fast, deterministic = reduce_by_task(losses, ids, 7), reduce_by_task(losses, ids, 7, deterministic=True)
    # ~1,430 float32 terms of ~5 per task: summed in another order (the one-hot product is blocked by the BLAS
    # threads) they differ by ~sqrt(n) * eps * sum ~ 0.02 of ~7,150, so each is checked against the float64 sums
    exact = torch.zeros(7, dtype=torch.float64).index_add_(0, ids, losses.double())
    for sums, counts in (fast, deterministic):
        torch.testing.assert_close(sums.double(), exact, rtol=1e-5, atol=0)
        assert counts.tolist() == torch.bincount(ids, minlength=7).tolist()


@pytest.fixture
def restore_determinism():
    yield
    torch.use_deterministic_algorithms(False)  # full_determinism switches it on for the whole process


def test_full_determinism_takes_the_fixed_order_reduction(tmp_path, monkeypatch, restore_determinism):
    calls = []

    def spy(losses, task_ids, num_tasks, deterministic=False):
        calls.append(deterministic)
        return reduce_by_task(losses, task_ids, num_tasks, deterministic)

    monkeypatch.setattr(objective_module, "reduce_by_task", spy)
    batch = masked_examples(8)
    plain = one_step(MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path / "a")), batch)
    exact = one_step(MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path / "b", full_determinism=True)), batch)
    assert calls == [False, True]
    assert exact.item() == pytest.approx(plain.item(), rel=1e-6)
