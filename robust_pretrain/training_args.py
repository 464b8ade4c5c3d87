"""Settings of the task-robust objective, as a ``TrainingArguments`` subclass (only the method's own fields)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .cli import check_checkpoint
from .options import Accepted, check_options, declare_inherited, declared_defaults, option
from .reference import PROVENANCE_ENTRIES, ReferenceRun
from .weighting import WEIGHTINGS, Weighting, WeightingArguments, accepted_options, build_weighting

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


# What the TrainingArguments fields that a run reads accept (TrainingArguments itself checks few of them).
TRAINING_ARGUMENTS_ACCEPTED = {
    "output_dir": Accepted(path="output_dir"),
    "per_device_train_batch_size": Accepted(minimum=1),
    "per_device_eval_batch_size": Accepted(minimum=1),
    "gradient_accumulation_steps": Accepted(minimum=1),
    "eval_accumulation_steps": Accepted(minimum=1),
    "learning_rate": Accepted(above=0),
    "weight_decay": Accepted(minimum=0),
    "adam_beta1": Accepted(minimum=0, below=1),
    "adam_beta2": Accepted(minimum=0, below=1),
    "adam_epsilon": Accepted(minimum=0),
    "max_grad_norm": Accepted(minimum=0),
    "num_train_epochs": Accepted(above=0),
    "max_steps": Accepted(
        minimum=-1,
        excluded=(0,),
        description="a positive number of optimizer steps (or -1 to train --num_train_epochs)",
    ),
    "warmup_steps": Accepted(minimum=0),
    "label_smoothing_factor": Accepted(minimum=0, below=1),
    "logging_steps": Accepted(above=0),
    "eval_steps": Accepted(above=0),
    "save_steps": Accepted(above=0),
    "save_total_limit": Accepted(minimum=1),
    "seed": Accepted(minimum=0, maximum=2**32 - 1),
    "data_seed": Accepted(minimum=0, maximum=2**32 - 1),
    "dataloader_num_workers": Accepted(minimum=0),
    "dataloader_prefetch_factor": Accepted(minimum=1),
    "neftune_noise_alpha": Accepted(above=0),
}
declare_inherited(TrainingArguments, TRAINING_ARGUMENTS_ACCEPTED)
_WEIGHTING_DEFAULTS = declared_defaults(WeightingArguments)


@dataclass
class MinimaxTrainingArguments(WeightingArguments, TrainingArguments):
    """``TrainingArguments`` plus the settings of the task-weighting objective (the strategies' options are those of
    :class:`~robust_pretrain.weighting.WeightingArguments`, declared there once).

    Task weights are recomputed once per optimizer step from the first micro-batch of the step (all processes'
    targets pooled); with ``gradient_accumulation_steps=1`` that is the paper's current-batch rule.
    """

    task_names: list[str] = field(
        default_factory=list, metadata={"help": "Names of the T upstream tasks, in task-id order (required)."}
    )
    weighting: str = option("minimax", "Task-weighting strategy.", choices=list(WEIGHTINGS))
    gradnorm_shared_module: str | None = field(
        default=None,
        metadata={
            "help": "gradnorm: dotted name of the shared module whose gradient norms are balanced "
            "(default: the last encoder layer)."
        },
    )
    weighting_learning_rate: float | None = option(
        None,
        "Learning rate of learnable weighting parameters (uncertainty, gradnorm); default: learning_rate.",
        above=0,
    )
    sparse_mlm_head: bool = field(
        default=True,
        metadata={"help": "Compute vocabulary logits only at target positions when the model has an MLM head."},
    )
    causal_lm_chunk_size: int = option(
        128,
        "Causal LMs: compute the next-token losses this many target positions at a time from the final hidden states, "
        "so only one chunk's logits exist at once (recomputed in the backward pass) instead of [batch, seq, vocab]; "
        "0 keeps the model's full logits.",
        minimum=0,
    )
    max_logged_tasks: int = option(
        32,
        "With more tasks than this, training logs (console, trainer_state.json) carry a summary (worst task and its "
        "loss, mean task loss, entropy and effective number of the weights) instead of task_loss/<name> and "
        "task_weight/<name> per task; those go to task_metrics.jsonl in output_dir (one line per logging step) and "
        "to TensorBoard when it is a report_to target.",
        minimum=0,
    )

    reference_run: str | None = option(
        None,
        "loss_normalization='excess': take the reference losses from this finished run's task_report.json (its "
        "held-out per-task losses; typically the same recipe with weighting=proportional). Its provenance (tasks, "
        "tokenizer, held-out data) must match this run's, see reference_mismatch_ok.",
        path="dir",
    )
    reference_mismatch_ok: list[str] = option(
        default_factory=list,
        help="Provenance entries of reference_run allowed to differ from this run's (each difference is otherwise "
        "refused).",
        choices=PROVENANCE_ENTRIES,
    )

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting: unknown strategy {self.weighting!r}; choose one of {sorted(WEIGHTINGS)}")
        check_options(self)
        use_cpu_when_launched_without_accelerator(self)
        super().__post_init__()
        if isinstance(self.task_names, str) or not all(isinstance(name, str) for name in self.task_names):
            raise ValueError(
                f"task_names must be a sequence of strings, e.g. ['verb', 'noun'], got {self.task_names!r}"
            )
        if not self.task_names:
            raise ValueError("task_names: give the names of the upstream tasks, e.g. ['verb', 'noun', ...]")
        if len(set(self.task_names)) != len(self.task_names):
            raise ValueError(f"task_names: names must be unique, got {self.task_names}")
        self._resolve_reference()
        accepted = accepted_options(self.weighting)
        ignored = [
            name for name, unset in _WEIGHTING_DEFAULTS.items() if name not in accepted and getattr(self, name) != unset
        ]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: not used by weighting={self.weighting!r}")
        if self.gradnorm_shared_module is not None and self.weighting != "gradnorm":
            raise ValueError(f"gradnorm_shared_module: not used by weighting={self.weighting!r}")
        self._check_meaningful()
        # Fail now, naming the field, rather than when the trainer builds the strategy.
        self.build_weighting()

    def _resolve_reference(self) -> None:
        """Check the reference options; ``reference_run`` fills ``reference_losses`` (in task order)."""
        if self.reference_mismatch_ok and self.reference_run is None:
            raise ValueError("reference_mismatch_ok: only used with reference_run")
        given = [name for name in ("reference_run", "reference_model") if getattr(self, name) is not None]
        if not given:
            return
        if len(given) > 1:
            raise ValueError("reference_run and reference_model: give one reference (a finished run or a model)")
        name = given[0]
        if not WEIGHTINGS[self.weighting].loss_driven:
            raise ValueError(
                f"{name}: weighting={self.weighting!r} does not weigh the tasks by their losses, so it cannot use a "
                "reference; choose a loss-driven strategy (minimax, group_dro, hardmax, morbit, dwa)"
            )
        if self.loss_normalization != "excess":
            raise ValueError(
                f"{name} is the reference of loss_normalization='excess' (this run has {self.loss_normalization!r}); "
                "add --loss_normalization excess"
            )
        if self.reference_losses is not None:
            raise ValueError(f"{name} and reference_losses: give one reference")
        if self.reference_model is not None:
            check_checkpoint(self.reference_model, "--reference_model")
        else:
            self.reference_losses = ReferenceRun.load(self.reference_run).reference_losses(self.task_names)

    def _check_meaningful(self) -> None:
        """Refuse values accepted alone that mean nothing here; warn about a worst case over one task."""
        tasks = len(self.task_names)
        if self.reference_losses is not None and self.loss_normalization != "excess":
            raise ValueError(
                f"reference_losses: only used with loss_normalization='excess' (this run has "
                f"{self.loss_normalization!r}); add --loss_normalization excess or drop them"
            )
        if self.alpha_auto_k is not None and self.alpha_auto_k > tasks:
            raise ValueError(
                f"alpha_auto_k {self.alpha_auto_k:g} exceeds the {tasks} tasks: the weights would be uniform "
                f"(weighting='average'); choose a target in [1, {tasks}]"
            )
        if tasks == 1 and self.weighting not in ("average", "proportional"):
            logger.warning(
                "task_names %s: one task, so weighting=%r has no other task to weigh against: the run is plain "
                "(not worst-case) training",
                self.task_names,
                self.weighting,
            )

    def weighting_options(self) -> dict:
        """The options of the chosen strategy, read from this object's fields."""
        accepted = accepted_options(self.weighting)
        return {name: getattr(self, name) for name in _WEIGHTING_DEFAULTS if name in accepted}

    def build_weighting(self) -> Weighting:
        """Instantiate the configured strategy for ``len(task_names)`` tasks."""
        return build_weighting(self.weighting, len(self.task_names), **self.weighting_options())
