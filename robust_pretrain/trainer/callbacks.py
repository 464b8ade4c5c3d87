"""The callbacks :class:`~robust_pretrain.trainer.MinimaxTrainer` adds to every run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import TrainerCallback
from transformers.trainer_utils import IntervalStrategy

if TYPE_CHECKING:
    from .minimax import MinimaxTrainer


class LogLastStepCallback(TrainerCallback):
    """Logs the last optimizer step when ``max_steps`` is not a multiple of ``logging_steps`` (its task weights and
    losses would otherwise be missing from the log history and the trajectory plot)."""

    def on_step_end(self, args, state, control, **kwargs):
        if args.logging_strategy == IntervalStrategy.STEPS and state.global_step >= state.max_steps > 0:
            control.should_log = True


class LearnableWeightsCallback(TrainerCallback):
    """Averages the gradients of learnable weighting parameters over processes and clears them after each step."""

    def __init__(self, trainer: MinimaxTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        for param in self.trainer.weighting.parameters():
            if param.grad is not None and self.trainer.accelerator.num_processes > 1:
                param.grad = self.trainer.accelerator.reduce(param.grad, reduction="mean")

    def on_optimizer_step(self, args, state, control, **kwargs):
        for param in self.trainer.weighting.parameters():
            param.grad = None
