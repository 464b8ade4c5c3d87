"""Settings of the task-robust objective, as a ``TrainingArguments`` subclass (only the method's own fields)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .weighting import ALPHA_SCHEDULES, LOSS_NORMALIZATIONS, WEIGHTINGS, Weighting, accepted_options, build_weighting

logger = logging.getLogger(__name__)


def use_cpu_when_launched_without_accelerator(args: TrainingArguments) -> None:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1) on a machine without an accelerator, set ``use_cpu`` (gloo DDP).

    Without it Transformers leaves every process outside the process group: each trains and writes its own copy of
    the run into the same ``output_dir``. ``accelerate launch`` sets ``ACCELERATE_USE_CPU`` for this itself.
    Call before ``TrainingArguments.__post_init__``.
    """
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1 and not args.use_cpu and not torch.accelerator.is_available():
        logger.info("%d processes and no accelerator: use_cpu=True (DDP over gloo)", processes)
        args.use_cpu = True


# Fields handed to the weighting strategy, with the value that means "not set by the user".
_WEIGHTING_FIELDS = {
    "alpha": 1.0,
    "alpha_schedule": "constant",
    "weight_floor": 0.0,
    "loss_ema": 0.0,
    "loss_normalization": "raw",
    "reference_losses": None,
    "dro_step_size": 0.01,
    "dro_smoothing": 1e-3,
    "morbit_step_size": 0.01,
    "gradnorm_alpha": 1.5,
    "dwa_temperature": 2.0,
    "dwa_window": 20,
}


@dataclass
class MinimaxTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the settings of the task-weighting objective.

    Task weights are recomputed once per optimizer step from the first micro-batch of the step (all processes'
    targets pooled); with ``gradient_accumulation_steps=1`` that is the paper's current-batch rule.
    """

    task_names: list[str] = field(
        default_factory=list, metadata={"help": "Names of the T upstream tasks, in task-id order (required)."}
    )
    weighting: str = field(
        default="minimax",
        metadata={"help": f"Task-weighting strategy: one of {', '.join(WEIGHTINGS)}.", "choices": list(WEIGHTINGS)},
    )
    alpha: float = field(
        default=1.0, metadata={"help": "minimax: softmax scale alpha (alpha_0 with the sqrt schedule)."}
    )
    alpha_schedule: str = field(
        default="constant",
        metadata={
            "help": "minimax: 'constant' alpha or 'sqrt' (alpha_k = alpha_0 * sqrt(k+1), Thm 3.1).",
            "choices": list(ALPHA_SCHEDULES),
        },
    )
    weight_floor: float = field(
        default=0.0, metadata={"help": "minimax: mix eps of the uniform distribution into the weights, in [0, 1)."}
    )
    loss_ema: float = field(
        default=0.0, metadata={"help": "Loss-driven strategies: EMA factor of the task-loss estimates, in [0, 1)."}
    )
    loss_normalization: str = field(
        default="raw",
        metadata={
            "help": "Loss-driven strategies: 'raw' (the paper), 'relative' (L_t / L_t at the first step) or "
            "'excess' (max(L_t - reference_t, 0), needs reference_losses).",
            "choices": list(LOSS_NORMALIZATIONS),
        },
    )
    reference_losses: list[float] | None = field(
        default=None, metadata={"help": "One reference loss per task, for loss_normalization='excess'."}
    )
    dro_step_size: float = field(default=0.01, metadata={"help": "group_dro: exponentiated-gradient step eta."})
    dro_smoothing: float = field(default=1e-3, metadata={"help": "group_dro: uniform smoothing eps, in [0, 1)."})
    morbit_step_size: float = field(default=0.01, metadata={"help": "morbit: projected-ascent step gamma."})
    gradnorm_alpha: float = field(default=1.5, metadata={"help": "gradnorm: asymmetry alpha."})
    gradnorm_shared_module: str | None = field(
        default=None,
        metadata={
            "help": "gradnorm: dotted name of the shared module whose gradient norms are balanced "
            "(default: the last encoder layer)."
        },
    )
    dwa_temperature: float = field(default=2.0, metadata={"help": "dwa: temperature tau."})
    dwa_window: int = field(default=20, metadata={"help": "dwa: optimizer steps per loss-averaging window."})
    weighting_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of learnable weighting parameters (uncertainty, gradnorm); default: learning_rate."
        },
    )
    sparse_mlm_head: bool = field(
        default=True,
        metadata={"help": "Compute vocabulary logits only at target positions when the model has an MLM head."},
    )

    def __post_init__(self) -> None:
        use_cpu_when_launched_without_accelerator(self)
        super().__post_init__()
        if not self.task_names:
            raise ValueError("task_names: give the names of the upstream tasks, e.g. ['verb', 'noun', ...]")
        if len(set(self.task_names)) != len(self.task_names):
            raise ValueError(f"task_names: names must be unique, got {self.task_names}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting: unknown strategy {self.weighting!r}; choose one of {sorted(WEIGHTINGS)}")
        accepted = accepted_options(self.weighting)
        ignored = [
            name for name, unset in _WEIGHTING_FIELDS.items() if name not in accepted and getattr(self, name) != unset
        ]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: not used by weighting={self.weighting!r}")
        if self.gradnorm_shared_module is not None and self.weighting != "gradnorm":
            raise ValueError(f"gradnorm_shared_module: not used by weighting={self.weighting!r}")
        if self.weighting_learning_rate is not None and not self.weighting_learning_rate > 0:
            raise ValueError(f"weighting_learning_rate must be > 0, got {self.weighting_learning_rate}")
        # Fail now, naming the field, rather than when the trainer builds the strategy.
        self.build_weighting()

    def weighting_options(self) -> dict:
        """The options of the chosen strategy, read from this object's fields."""
        accepted = accepted_options(self.weighting)
        return {name: getattr(self, name) for name in _WEIGHTING_FIELDS if name in accepted}

    def build_weighting(self) -> Weighting:
        """Instantiate the configured strategy for ``len(task_names)`` tasks."""
        return build_weighting(self.weighting, len(self.task_names), **self.weighting_options())
