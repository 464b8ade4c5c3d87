"""The last optimizer step is logged even when max_steps is not a multiple of logging_steps."""

import pytest
import torch
from test_trainer import make_args
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert

from robust_pretrain import MinimaxTrainer


def test_last_step_is_logged_with_its_task_weights_and_losses(tmp_path):
    args = make_args(tmp_path, max_steps=3, logging_steps=2, per_device_train_batch_size=4)
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(16)))
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 3]
    last = logged[-1]
    assert [last[f"task_weight/{t}"] for t in TASKS] == pytest.approx(trainer.step_weights.tolist(), abs=1e-6)
    assert sum(last[f"task_weight/{t}"] for t in TASKS) == pytest.approx(1.0, abs=1e-5)
    assert all(torch.isfinite(torch.tensor(last[f"task_loss/{t}"])) for t in TASKS)


def test_no_extra_log_when_the_last_step_is_a_logging_step(tmp_path):
    args = make_args(tmp_path, max_steps=4, logging_steps=2, per_device_train_batch_size=4)
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(16)))
    trainer.train()
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [2, 4]
