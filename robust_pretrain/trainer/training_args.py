"""Settings of the task-robust objective, as a ``TrainingArguments`` subclass (only the method's own fields)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments
from transformers.training_args import ParallelMode

from ..cli import check_checkpoint
from ..options import Accepted, check_options, declare_inherited, declared_defaults, option
from ..reference import PROVENANCE_ENTRIES, ReferenceRun
from ..weighting import WEIGHTINGS, Weighting, WeightingArguments, accepted_options, build_weighting
from .task_sampling import check_importance_sampling, ordered_weights, refuse_learned_sampler, task_weights

logger = logging.getLogger(__name__)

#: the orders of ``weight_update`` (see :mod:`robust_pretrain.trainer.weight_update`)
WEIGHT_UPDATES = ("alternating", "simultaneous")


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


def refuse_missing_deepspeed(args: TrainingArguments) -> None:
    """Refuse ``deepspeed`` when DeepSpeed is not installed (Transformers fails with a traceback). Call before
    ``TrainingArguments.__post_init__``."""
    if args.deepspeed and importlib.util.find_spec("deepspeed") is None:
        raise ValueError(
            f"deepspeed {args.deepspeed}: DeepSpeed is not installed; install it (pip install deepspeed, on a machine "
            "with GPUs) or drop --deepspeed"
        )


def refuse_single_process_fsdp(args: TrainingArguments) -> None:
    """Refuse ``fsdp`` in a run of one process (Transformers fails with a traceback when the trainer is built, after
    the data work). Call after ``TrainingArguments.__post_init__``."""
    if args.fsdp and not args.fsdp_config.get("xla", False) and args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise ValueError(
            "fsdp: FSDP shards the model over processes and this run has one; launch 2 or more (torchrun "
            "--nproc_per_node N, accelerate launch --num_processes N) or drop --fsdp"
        )


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
TASK_SAMPLING_MODES = ("none", "online", "fixed")


@dataclass
class MinimaxTrainingArguments(WeightingArguments, TrainingArguments):
    """``TrainingArguments`` plus the settings of the task-weighting objective (the strategies' options are those of
    :class:`~robust_pretrain.weighting.WeightingArguments`, declared there once).

    Task weights are recomputed once per optimizer step from the first micro-batch of the step (all processes'
    targets pooled); with ``gradient_accumulation_steps=1`` that is the paper's current-batch rule.

    The tasks come from the data: ``MinimaxTrainer`` takes ``task_names`` from its data collator (or model) when they
    are not given here, and the checks that need the number of tasks T run there (:meth:`bind_tasks`); the others run
    at construction.
    """

    task_names: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Names of the T tasks, in task-id order (default: the data collator's task_names, else the "
            "model's)."
        },
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
    causal_lm_chunk_size: int | None = option(
        None,
        "Causal LMs: compute the next-token losses from the final hidden states one slice of the vocabulary at a "
        "time, each slice's logits no larger than this many targets' full logits (recomputed in the backward pass) "
        "instead of [batch, seq, vocab]; unset: from the shapes, next_pow2(ceil(targets / ceil(vocab / hidden))) "
        "clamped to 128..8192 (Liger kernel's rule: a slice's logits about the size of the hidden states), logged; "
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

    weight_update: str = option(
        "alternating",
        "When the strategy's weights move: 'alternating' weighs each step by the losses of its own first micro-batch "
        "(the weights first, then the model at them); 'simultaneous' by the losses measured at the previous step (both "
        "from the same point, as in online mirror descent), so the weights are known before the forward pass and "
        "every micro-batch computes the head's gradients in it (causal LMs). Not with gradnorm.",
        choices=WEIGHT_UPDATES,
    )
    task_sampling: str = option(
        "none",
        "'none': batches as the data gives them, the objective the strategy's weights on the task means; 'online': "
        "each training sequence's task drawn from the strategy's current weights (batches of step s use those of "
        "step s-2), the objective the plain mean over the drawn targets; 'fixed': drawn from task_sampling_weights, "
        "the objective the strategy's (see importance_weighting). The data collator must accept a schedule "
        "(DomainCollator, TaskGroupedMLMCollator with mode='per_example'); see robust_pretrain.trainer.task_sampling.",
        choices=TASK_SAMPLING_MODES,
    )
    task_sampling_weights: dict[str, float] | str | list[float] | None = option(
        None,
        "task_sampling='fixed': the sampling weight q_t of each task (not all 0; normalised), by name: "
        "{task: weight} in Python, 'name=weight ...' on the command line, or a JSON object or file (e.g. the "
        "domain_weights.json of robust-pretrain-mixture); or one weight per task in task order.",
        minimum=0,
    )
    importance_weighting: bool = option(
        False,
        "task_sampling='fixed': multiply each target's loss by w_t / q_t (w: the strategy's weights, q: the sampling "
        "weights) and divide the step's sum by its number of targets, so that the expected gradient is that of "
        "sum_t w_t L_t whatever q is (exactly when every sequence has one task and as many targets: packed domains; "
        "NeMo AutoModel's domain_mixture; w weighs every task at every step, a task the batch did not draw from its "
        "last estimate; a task with q_t below 0.001 / T is refused); without it the strategy weighs the drawn "
        "batch's task means.",
    )

    max_epochs_per_task: float | None = option(
        None,
        "task_sampling='online': an epoch cap per task (UniMax's, for online sampling): once the draws of a task reach "
        "this many times its training sequences, its sampling weight is 0 and the others are renormalised (counted "
        "exactly from the draws; the step that crosses the cap may overshoot by part of one global batch).",
        above=0,
    )
    reference_run: str | None = option(
        None,
        "loss_normalization='excess': take the reference losses from this finished run's task_report.json (its "
        "held-out per-task losses; typically the same recipe with weighting=proportional). Its provenance (tasks, "
        "tokenizer, training and held-out data, model size) must match this run's, see reference_mismatch_ok.",
        path="dir",
    )
    reference_mismatch_ok: list[str] = option(
        default_factory=list,
        help="Provenance entries allowed to differ between this run and an earlier run's output that it uses "
        "(reference_run, the decoder's domain_weights; of reference_model only the tokenizer is compared); any other "
        "difference, or an entry the input does not record, is refused.",
        choices=PROVENANCE_ENTRIES,
    )

    def __post_init__(self) -> None:
        self.task_sampling_weights = task_weights(self.task_sampling_weights)
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting: unknown strategy {self.weighting!r}; choose one of {sorted(WEIGHTINGS)}")
        check_options(self)
        use_cpu_when_launched_without_accelerator(self)
        refuse_missing_deepspeed(self)
        super().__post_init__()
        refuse_single_process_fsdp(self)
        if isinstance(self.task_names, str | None) or not all(isinstance(name, str) for name in self.task_names):
            raise ValueError(
                f"task_names must be a sequence of strings, e.g. ['verb', 'noun'], got {self.task_names!r} (leave it "
                "out to take the tasks from the data collator or the model)"
            )
        if len(set(self.task_names)) != len(self.task_names):
            raise ValueError(f"task_names: names must be unique, got {self.task_names}")
        self._check_reference()
        accepted = accepted_options(self.weighting)
        ignored = [
            name for name, unset in _WEIGHTING_DEFAULTS.items() if name not in accepted and getattr(self, name) != unset
        ]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: not used by weighting={self.weighting!r}")
        if self.gradnorm_shared_module is not None and self.weighting != "gradnorm":
            raise ValueError(f"gradnorm_shared_module: not used by weighting={self.weighting!r}")
        self._check_meaningful()
        if self.task_names:
            strategy = self.bind_tasks(self.task_names)
        else:  # the strategy's checks that do not depend on T, for a stand-in number of tasks
            stand_in = len(self.reference_losses or self.task_sampling_weights or [None])
            options = self.weighting_options()
            if self.reference_run is not None:  # its losses are read for the tasks
                options["reference_losses"] = [0.0] * stand_in
            strategy = build_weighting(self.weighting, stand_in, **options)
        self._check_sampling(strategy)

    def _check_meaningful(self) -> None:
        """Refuse values accepted alone that mean nothing here (the checks that need the tasks: :meth:`bind_tasks`)."""
        if self.reference_losses is not None and self.loss_normalization != "excess":
            raise ValueError(
                f"reference_losses: only used with loss_normalization='excess' (this run has "
                f"{self.loss_normalization!r}); add --loss_normalization excess or drop them"
            )

    def _check_for_tasks(self, tasks: int) -> None:
        """Refuse ``alpha_auto_k`` above the number of tasks; warn about a worst case over one task."""
        if self.alpha_auto_k is not None and self.alpha_auto_k > tasks:
            raise ValueError(
                f"alpha_auto_k {self.alpha_auto_k:g} exceeds the {tasks} tasks: the weights would be uniform "
                f"(weighting='average'); choose a target in [1, {tasks}]"
            )
        if tasks == 1 and self.weighting not in ("average", "proportional") and not vars(self).get("_warned_one_task"):
            self._warned_one_task = True  # bound again by the trainer: said once
            logger.warning(
                "task_names %s: one task, so weighting=%r has no other task to weigh against: the run is plain "
                "(not worst-case) training",
                self.task_names,
                self.weighting,
            )

    def bind_tasks(self, task_names: Sequence[str]) -> Weighting:
        """The checks that need the tasks (``MinimaxTrainer`` calls this with the data's tasks): set ``task_names``
        (refusing another list), take ``reference_run``'s losses for them and build the strategy for them (refusing
        ``reference_losses`` or ``task_sampling_weights`` of another length); the strategy is returned."""
        names = list(task_names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"task_names: give distinct names of one or more tasks, got {names}")
        if self.task_names and list(self.task_names) != names:
            raise ValueError(f"task_names {list(self.task_names)} differ from the data's tasks {names}")
        self.task_sampling_weights = task_weights(self.task_sampling_weights)  # also as assigned after construction
        if self.task_sampling == "fixed" and self.task_sampling_weights is None:
            raise ValueError("task_sampling='fixed' draws from task_sampling_weights: give one per task")
        if self.task_sampling_weights is not None:
            ordered_weights(self.task_sampling_weights, names)
        if self.reference_run is not None and self.reference_losses is None:
            self.reference_losses = ReferenceRun.load(self.reference_run).reference_losses(names)
        self.task_names = names
        self._check_for_tasks(len(names))
        strategy = self.build_weighting()
        self._check_sampling(strategy)
        return strategy

    def sampling_weights(self) -> list[float] | None:
        """``task_sampling_weights`` in the order of ``task_names`` (a mapping needs the tasks bound)."""
        if self.task_sampling_weights is None or not isinstance(self.task_sampling_weights, dict):
            return self.task_sampling_weights
        if not self.task_names:
            return list(self.task_sampling_weights.values())  # the checks that need no order
        return ordered_weights(self.task_sampling_weights, list(self.task_names))

    def _check_sampling(self, strategy: Weighting) -> None:
        """The task-sampling options, with ``strategy`` built from these arguments."""
        weights = self.sampling_weights()
        if weights is not None and self.task_sampling != "fixed":
            raise ValueError("task_sampling_weights: the weights of task_sampling='fixed', and only of it")
        if weights is not None and not sum(weights) > 0:
            raise ValueError(f"task_sampling_weights: not all 0, got {weights}")
        if weights is not None and not math.isfinite(sum(weights)):  # the draws normalise by the sum
            raise ValueError(f"task_sampling_weights: the weights' sum overflows ({weights}); scale them down")
        if self.importance_weighting and self.task_sampling != "fixed":
            raise ValueError("importance_weighting: corrects the draws of task_sampling='fixed', and only those")
        if self.max_epochs_per_task is not None and self.task_sampling != "online":
            raise ValueError("max_epochs_per_task: caps the draws of task_sampling='online', and only those")
        if self.task_sampling == "online" and self.reference_model is not None:
            raise ValueError("task_sampling='online' minimises the plain mean: it cannot use reference_model")
        if self.weight_update == "simultaneous" and strategy.needs_grad_norms:
            raise ValueError(
                f"weight_update='simultaneous': weighting={self.weighting!r} weighs by this step's per-task gradient "
                "norms, which exist only after its forward pass; use weight_update='alternating'"
            )
        if self.task_sampling == "online" or self.importance_weighting:
            refuse_learned_sampler(strategy, f"weighting={self.weighting!r}")
        if self.importance_weighting and weights is not None and len(weights) == strategy.num_tasks:
            named = self.task_sampling_weights if isinstance(self.task_sampling_weights, dict) else None
            check_importance_sampling(weights, self.task_names or (list(named) if named else None))

    def _check_reference(self) -> None:
        """Check the reference options (:meth:`bind_tasks` takes ``reference_run``'s losses for the tasks)."""
        given = [name for name in ("reference_run", "reference_model") if getattr(self, name) is not None]
        if not given and self.loss_normalization == "excess" and self.reference_losses is None:
            raise ValueError(
                "loss_normalization='excess' needs a reference: reference_losses, reference_run or reference_model"
            )
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
            ReferenceRun.load(self.reference_run)

    def weighting_options(self) -> dict:
        """The options of the chosen strategy, read from this object's fields."""
        accepted = accepted_options(self.weighting)
        return {name: getattr(self, name) for name in _WEIGHTING_DEFAULTS if name in accepted}

    def build_weighting(self) -> Weighting:
        """Instantiate the configured strategy for ``len(task_names)`` tasks (see :meth:`bind_tasks`)."""
        return build_weighting(self.weighting, len(self.task_names), **self.weighting_options())
