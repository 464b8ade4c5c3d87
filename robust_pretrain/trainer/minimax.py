"""``MinimaxTrainer`` itself: construction (tasks, sampling, heads, reference model, callbacks), the data hooks, the
``compute_loss`` hook and the optimizer; its loss, logging and checkpoint sides are the mixins of
:mod:`~robust_pretrain.trainer.objective`, :mod:`~robust_pretrain.trainer.task_logs` and
:mod:`~robust_pretrain.trainer.checkpoints` (the package docstring describes the whole)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import transformers
from accelerate.data_loader import DataLoaderDispatcher
from accelerate.utils import DistributedType, extract_model_from_parallel
from transformers import Trainer
from transformers.utils import logging

from ..reference import ReferenceModel, ShardReferenceCallback
from ..seeding import SetEpochCallback
from ..task_losses import HOST_TARGET_COLUMNS, HostTargets, TargetPositionsHead, TaskTargets
from ..weighting import Weighting
from .callbacks import LearnableWeightsCallback, LogLastStepCallback
from .checkpoints import WeightingCheckpoints
from .models import is_causal_lm
from .next_token_loss import ChunkedNextTokenLoss, check_sharding
from .objective import TaskObjective, first_rows
from .process_group import register_process_group_teardown
from .task_logs import TaskLogs
from .task_sampling import (
    EpochCap,
    ImportanceWeighting,
    TaskSamplingCallback,
    TaskSamplingSchedule,
    TaskSamplingWeighting,
)
from .training_args import MinimaxTrainingArguments
from .training_data import check_training_data

logger = logging.get_logger(__package__)  # the trainer's one logger, robust_pretrain.trainer

#: batch columns kept whatever the model's ``forward`` accepts (``labels`` go with ``task_ids``, never to the model)
TASK_COLUMNS = ("labels", "shift_labels", "task_ids", "token_task_ids", "word_ids", "special_tokens_mask")


class MinimaxTrainer(TaskObjective, TaskLogs, WeightingCheckpoints, Trainer):
    """``Trainer`` whose loss is ``sum_t w_t L_t`` with weights from a :mod:`robust_pretrain.weighting` strategy.

    Batches carry ``labels`` and ``task_ids`` (token-level, same shape as ``labels``, or one id per example; ``-100``
    marks a non-target; another negative id on a labelled element, an id >= T or a label outside the logits' classes
    is an error). Alternatively the model returns ``task_losses`` (a dict task name ->
    mean loss of this micro-batch) and optionally ``task_counts``; then each micro-batch's task means are pooled over
    processes (exactly, with the counts) and averaged over micro-batches, and the step's weights come from the first
    micro-batch (with accumulation, a task missing from it gets no weight in that step, and ``step_weights`` holds the
    effective weights ``k_t / GA * w_t``, see ``robust_pretrain.trainer``). Pass ``weighting=`` to use a strategy
    instance instead of the one the arguments describe. A causal LM (``is_causal_lm``) learns next-token targets:
    labels are shifted as its own loss shifts them, token-level ``task_ids`` with them (a target's task is the
    predicted token's).
    """

    # compute_loss normalises by the whole step's global per-task counts: the Trainer must not divide again.
    loss_is_scaled_for_ga = True

    def __init__(self, *args: Any, weighting: Weighting | None = None, **kwargs: Any) -> None:
        if "loss_is_scaled_for_ga" not in vars(Trainer):
            # Older Trainers ignore the attribute and divide every loss without `num_items_in_batch` by GA again.
            raise ImportError(
                "MinimaxTrainer needs transformers>=5.19 (Trainer.loss_is_scaled_for_ga), "
                f"found {transformers.__version__}"
            )
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, MinimaxTrainingArguments):
            raise TypeError(f"MinimaxTrainer needs MinimaxTrainingArguments, got {type(self.args).__name__}")
        if self.compute_loss_func is not None:
            raise ValueError(
                "compute_loss_func: MinimaxTrainer computes one loss per task from `labels` and `task_ids`; "
                "return per-task losses from the model as `task_losses` (and `task_counts`) instead"
            )
        strategy = self.args.bind_tasks(self._data_task_names())
        self.task_names: list[str] = list(self.args.task_names)
        check_training_data(self.train_dataset, self.task_names)
        # compute_loss returns a loss for every batch (from `labels` + `task_ids` or the model's `task_losses`), so
        # prediction_step must call it even for a model whose forward has no `labels` or `return_loss` parameter.
        self.can_return_loss = True
        #: the sampling weights by step of ``task_sampling`` (None: batches as the data gives them)
        self.task_schedule = self._sample_tasks() if self.args.task_sampling != "none" else None
        self.weighting = self._sampling_objective(weighting or strategy).to(self.args.device)
        if self.weighting.num_tasks != self.num_tasks:
            raise ValueError(f"weighting has {self.weighting.num_tasks} tasks, task_names has {self.num_tasks}")
        #: next-token targets: the labels (and token-level task ids) are shifted as the model's own loss shifts them
        self.causal_lm = is_causal_lm(self.model)
        sparse_head = self.args.sparse_mlm_head and not self.causal_lm
        self.mlm_head = TargetPositionsHead.attach(self.model) if sparse_head else None
        #: a causal LM's per-target losses computed chunk by chunk from its hidden states (``causal_lm_chunk_size``)
        self.lm_loss = self._chunked_lm_loss()
        #: the frozen model of ``reference_model`` (online excess loss), run on each step's first micro-batch
        self.reference = ReferenceModel.of_trainer(self.args, self.model, self.accelerator, sparse_head)
        if self.reference is not None:  # under FSDP2, sharded like the model once training has sharded it
            self.add_callback(ShardReferenceCallback(self.reference, self.accelerator))
        #: the reference model's per-target losses by the same chunked path (its full logits never exist)
        self.reference_lm_loss = (
            ChunkedNextTokenLoss.attach(self.reference.model, self.args.causal_lm_chunk_size)
            if self.reference is not None and self.lm_loss is not None
            else None
        )
        #: the weights of the step's objective over the union of its batches (as logged and checkpointed)
        self.step_weights = torch.zeros(self.num_tasks)
        self._rule_weights = torch.zeros(self.num_tasks)  # the strategy's weights, applied to each micro-batch
        self._device_rule_weights = self._rule_weights.to(self.args.device)  # the same, where the losses are
        self._step_counts: torch.Tensor | None = None
        self._target_losses: torch.Tensor | None = None  # the last forward pass's per-target losses (detached)
        self._micro_index = 0
        #: the step's weights where known before its first forward pass (see TaskObjective._prepare_weights)
        self._weights_ahead: torch.Tensor | None = None
        self._host_step_counts: torch.Tensor | None = None
        #: weight_update='simultaneous': the last step's first micro-batch's pooled per-task sums and counts
        self._previous_observation: torch.Tensor | None = None
        #: each prefetched micro-batch's targets, by the identity of its ``labels`` (computed once per micro-batch)
        self._batch_targets: dict[int, tuple[torch.Tensor, TaskTargets]] = {}
        #: device-side bookkeeping of the step's later micro-batches, read at its last one (see _weighted_objective)
        self._later_nonfinite: torch.Tensor | None = None
        self._later_presence: torch.Tensor | None = None
        # Running per-task (loss sums, counts) in float64: batch sums add up exactly, whatever the order of the
        # batches and processes, so 2-process eval losses equal the 1-process ones. The training sums stay on the
        # device until a log reads them.
        self._train_sums = torch.zeros(2 * self.num_tasks, dtype=torch.float64, device=self.args.device)
        self._eval_sums = torch.zeros(2 * self.num_tasks, dtype=torch.float64)
        self._collecting_predictions = False
        self._shared_params: list[torch.nn.Parameter] | None = None
        #: writes the run's model card; ``None`` keeps the Trainer's default card (see :meth:`create_model_card`)
        self.card_renderer: Callable[[], Any] | None = None
        if self.weighting.parameters():
            self.add_callback(LearnableWeightsCallback(self))
        self.add_callback(LogLastStepCallback())
        # new masks / augmentations each epoch (the same on resume) if the collator or dataset transform has set_epoch
        epoch_callback = SetEpochCallback.for_training_data(self.data_collator, self.train_dataset)
        if epoch_callback is not None:
            self.add_callback(epoch_callback)
        self._warn_about_silent_fallbacks()
        register_process_group_teardown()

    def _data_task_names(self) -> list[str]:
        """The tasks: ``task_names`` of the arguments, of the data collator or of the model (its config's), refusing
        two that disagree."""
        model = extract_model_from_parallel(self.model, keep_torch_compile=False)
        sources = {
            "the arguments' task_names": self.args.task_names,
            "the data collator's task_names": getattr(self.data_collator, "task_names", None),
            "the model's task_names": getattr(model, "task_names", None)
            or getattr(getattr(model, "config", None), "task_names", None),
        }
        given = [(where, list(names)) for where, names in sources.items() if names]
        if not given:
            raise ValueError(
                "task_names: no task names found; give MinimaxTrainingArguments(task_names=[...]) or a data collator "
                "with task_names (TaskGroupedMLMCollator, DomainCollator)"
            )
        (first, names), *others = given
        for where, other in others:
            if other != names:
                raise ValueError(f"{first} {names} differ from {where} {other}")
        return names

    def _sample_tasks(self) -> TaskSamplingSchedule:
        """``task_sampling``'s schedule, handed to the data collator, which draws each training sequence's task by it
        (and may replace the training data, e.g. by :class:`~robust_pretrain.data.domains.DrawSlots`)."""
        sample_tasks = getattr(self.data_collator, "sample_tasks", None)
        if sample_tasks is None:
            raise ValueError(
                f"task_sampling={self.args.task_sampling!r}: the data collator ({type(self.data_collator).__name__}) "
                "cannot draw tasks; use one with sample_tasks (DomainCollator, TaskGroupedMLMCollator with "
                "mode='per_example')"
            )
        schedule = TaskSamplingSchedule(
            self.num_tasks, self.args.gradient_accumulation_steps, fixed_weights=self.args.sampling_weights()
        )
        if self.train_dataset is not None:
            self.train_dataset = sample_tasks(schedule, self.train_dataset, self.args)
        self.add_callback(TaskSamplingCallback(schedule))
        return schedule

    def _sampling_objective(self, strategy: Weighting) -> Weighting:
        """The objective under ``task_sampling``: the strategy's own (none, fixed), the plain mean with the strategy
        drawing (online), or the importance-weighted strategy (fixed with ``importance_weighting``)."""
        if self.args.task_sampling == "online":
            return TaskSamplingWeighting(strategy, self.task_schedule, self._epoch_cap())
        if self.args.importance_weighting:
            return ImportanceWeighting(strategy, self.args.sampling_weights())
        return strategy

    def _epoch_cap(self) -> EpochCap | None:
        """``max_epochs_per_task``'s cap, counting the draws of the data collator (it must recount them)."""
        if self.args.max_epochs_per_task is None:
            return None
        if not hasattr(self.data_collator, "step_draw_counts"):
            raise ValueError(
                f"max_epochs_per_task: the data collator ({type(self.data_collator).__name__}) cannot count its draws; "
                "use DomainCollator on map-style sequences"
            )
        accumulation = self.args.gradient_accumulation_steps
        count = lambda step, weights: self.data_collator.step_draw_counts(step, weights, accumulation)  # noqa: E731
        return EpochCap(self.args.max_epochs_per_task, self.data_collator.domain_sequences(), count)

    def _warn_about_silent_fallbacks(self) -> None:
        """Say so when Accelerate quietly runs something other than what was asked: on CPU, an FSDP config runs DDP and
        ``fp16`` trains in fp32 (no autocast)."""
        requested = bool(self.args.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        running = self.accelerator.distributed_type
        if requested and running != DistributedType.FSDP:
            logger.warning(
                f"FSDP was requested (--fsdp or an Accelerate config with distributed_type FSDP) but Accelerate runs "
                f"{running.value} on {self.args.device.type}: nothing is sharded, every process holds the full model, "
                "gradients and optimizer state (on CPU: plain DDP). Accelerate shards only on GPUs and other "
                "accelerators; the results equal an FSDP run's, the memory use does not."
            )
        if self.accelerator.mixed_precision == "fp16" and not self.accelerator.native_amp:
            logger.warning(
                f"fp16 was requested but Accelerate does not autocast to fp16 on {self.args.device.type}: this run "
                "trains in fp32. On CPU use --bf16 for mixed precision."
            )

    def _chunked_lm_loss(self) -> ChunkedNextTokenLoss | None:
        if not self.causal_lm or self.args.causal_lm_chunk_size == 0:
            return None
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        check_sharding(self.accelerator.distributed_type.value, getattr(plugin, "fsdp_version", None))
        return ChunkedNextTokenLoss.attach(self.model, self.args.causal_lm_chunk_size)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    # ---------------------------------------------------------------------------------------------------- data
    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        self._signature_columns += [c for c in TASK_COLUMNS if c not in self._signature_columns]

    def get_train_dataloader(self) -> Any:
        """The Trainer's, its collator wrapped in ``robust_pretrain.task_losses.HostTargets``: each batch's
        targets are found on the host, before the batch is copied to the device (not where Accelerate dispatches
        batches, splitting them by rows after collation)."""
        collator = self.data_collator
        self.data_collator = host_targets = HostTargets(collator, self.num_tasks, self.causal_lm)
        try:
            dataloader = super().get_train_dataloader()
        finally:
            self.data_collator = collator
        host_targets.enabled = not isinstance(dataloader, DataLoaderDispatcher)
        return dataloader

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device) -> tuple[list, Any]:
        """Prefetch the step's micro-batches (as the Trainer does), take each one's targets (found on the host by the
        collator, else on the device: one sync), reused by :meth:`compute_loss`, and count each task's targets over
        all processes on the device."""
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        counts = torch.zeros(self.num_tasks, device=device)
        with_ids = [b for b in batch_samples if "task_ids" in b and "labels" in b]
        self._batch_targets = {}
        for batch in with_ids:
            targets = self._new_targets(batch)
            self._batch_targets[id(batch["labels"])] = (batch["labels"], targets)
            counts += targets.counts().to(device)
        self._step_counts = self._all_reduce(counts) if with_ids else None
        self._micro_index = 0
        return batch_samples, num_items_in_batch

    def _task_targets(self, batch: dict[str, Any]) -> TaskTargets:
        """The batch's targets: those :meth:`get_batch_samples` found for this very ``labels`` tensor, else new."""
        labels, targets = self._batch_targets.get(id(batch["labels"]), (None, None))
        return targets if labels is batch["labels"] else self._new_targets(batch)

    def _new_targets(self, batch: dict[str, Any]) -> TaskTargets:
        """The batch's targets, from the positions and task ids found on the host where the batch has them."""
        found = tuple(batch[c] for c in HOST_TARGET_COLUMNS) if HOST_TARGET_COLUMNS[0] in batch else None
        return TaskTargets(*self._targets(batch), self.num_tasks, found)

    # ------------------------------------------------------------ loss (the sums and the objective: TaskObjective)
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if model.training and self._micro_index == 0:
            self._prepare_weights()
        sums, counts, outputs = self._task_sums(model, inputs)
        if model.training:
            # the weights come from the step's first micro-batch: only there is the reference model's loss needed
            reference = self._reference_sums(inputs) if self.reference is not None and self._micro_index == 0 else None
            loss = self._weighted_objective(sums, counts, reference)
            self._train_sums += torch.cat([sums.detach(), counts]).to(self._train_sums.device)
        else:
            unique = self._unique_rows(inputs)
            if unique is not None:  # repeats end some process's batch: all run again (a sharded forward is collective)
                rerun = self._task_sums(model, first_rows(inputs, max(unique, 1)))[:2]  # its unique rows, at least one
                sums, counts = rerun if unique else (rerun[0] * 0, rerun[1] * 0)
            self._eval_sums += torch.cat([sums.detach(), counts]).cpu()
            loss = sums.sum() / counts.sum().clamp_min(1)
        return (loss, outputs) if return_outputs else loss

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over processes (on this process's device), or ``tensor`` itself in a 1-process run."""
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor.to(self.args.device), reduction="sum")

    # ------------------------------------------------------------------------------------- optimizer / model card
    def create_optimizer(self, model=None):
        params = self.weighting.parameters()
        if params and self.is_fsdp_enabled and self.accelerator.distributed_type == DistributedType.FSDP:
            raise ValueError(
                f"weighting={self.args.weighting!r} learns parameters that are not the model's, and under FSDP the "
                "optimizer may hold only the model's sharded parameters (Accelerate maps every optimizer parameter "
                "to its shard: KeyError otherwise)"
                + (
                    "; GradNorm also needs per-task gradients of a whole shared layer, which FSDP holds as DTensor "
                    "shards"
                    if self.weighting.needs_grad_norms
                    else ""
                )
                + ". Train it with DDP (no FSDP config), or use a loss-driven weighting (minimax, group_dro, ...)"
            )
        optimizer = super().create_optimizer(model)
        known = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if params and not known & {id(p) for p in params}:
            lr = self.args.weighting_learning_rate or self.args.learning_rate
            optimizer.add_param_group({"params": params, "weight_decay": 0.0, "lr": lr})
        return optimizer

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write ``card_renderer``'s card if one is set (``push_to_hub`` calls this too), else the Trainer's card."""
        if self.card_renderer is None:
            super().create_model_card(*args, **kwargs)
        elif self.is_world_process_zero():
            self.card_renderer()
