"""``MinimaxTrainer``: the Hugging Face ``Trainer`` with a task-weighted (worst-case) objective.

Per optimizer step, for tasks t = 1..T with per-task target sums ``S_t`` and global target counts ``N_t`` (over every
micro-batch of the step and every process):

* the weights ``w`` are computed once, at the step's first micro-batch, from that micro-batch's per-task mean losses
  pooled over all processes (with ``gradient_accumulation_steps=1``: the paper's current-batch rule); a task absent
  from that micro-batch but present later in the step uses its last estimate;
* each micro-batch contributes ``sum_t w_t * S_t / N_t``, so the accumulated gradient equals the gradient of
  ``sum_t w_t * mean_t`` over the union of the step's batches, whatever the number of processes or micro-batches.

Only ``get_batch_samples`` (global per-task counts), ``compute_loss``, ``evaluation_loop`` (per-task eval losses,
full-size logits when predictions are collected), ``log``, ``create_optimizer`` (learnable weights), ``save_model`` and
``train`` (weighting state in checkpoints) are overridden; ``training_step`` is the Trainer's own, told through
``loss_is_scaled_for_ga`` (transformers >= 5.19) not to divide by the accumulation steps again.

A model returning ``task_losses`` (and ``task_counts``) instead: its per-task counts are known only after each forward
pass, so the step cannot be pooled exactly before the first backward; each micro-batch contributes
``sum_t w_t * mean_t / GA`` (means pooled exactly over processes), and a task present in k of the GA micro-batches has
the effective weight ``k / GA * w_t`` on the mean of its micro-batch means: that effective weight is what
``step_weights``, the ``task_weight/*`` logs and checkpoints report (``w_t`` itself with ``GA = 1``). A task whose count
is 0 is absent (its loss, the mean of nothing, may be NaN).

With ``reference_model`` (DoReMi's online excess loss, :mod:`robust_pretrain.reference`) a frozen reference model
runs without gradient on each step's first micro-batch; its per-task loss sums on the same targets travel in that
micro-batch's all-reduce, and their pooled means reach the weighting as the step's ``reference_losses``.

The tasks come from the data: ``task_names`` of the arguments, else of the data collator, else of the model; lists
that disagree are refused at construction. ``task_sampling`` (``online``, ``fixed``) draws each training sequence's
task: the trainer builds the schedule of sampling weights, hands it to the data collator (``sample_tasks``) and logs
the sampling weights (:mod:`robust_pretrain.task_sampling`).

Resuming checks that the weighting is built with the options saved in the checkpoint (``ValueError`` naming those
that differ). In a distributed run the default process group is destroyed at interpreter exit (gloo's worker threads
otherwise abort the finished process: ``terminate called without an active exception``).

A causal LM (see :func:`is_causal_lm`) is trained on next-token targets, shifted exactly as its own loss shifts them
(``labels`` padded with -100 and shifted left, or the batch's ``shift_labels``); token-level ``task_ids`` are shifted
with the labels, so each target counts for the task of the predicted token. Its eval metrics add per-task perplexities.
Its losses come from the final hidden states, in slices of the vocabulary no larger than ``causal_lm_chunk_size``
targets' logits (unset: from the shapes), without the full logits (:mod:`robust_pretrain.causal_lm_loss`). The
training collator finds each batch's targets on the host (:class:`~robust_pretrain.task_losses.HostTargets`).

Trainer options: ``label_smoothing_factor`` smooths every task's cross-entropy (class labels); ``compute_loss_func``
is refused (return ``task_losses`` from the model instead). In distributed evaluation the repeats the sampler adds to
complete the last batch are left out of the per-task eval losses, which therefore equal the 1-process values.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import transformers
from accelerate.data_loader import DataLoaderDispatcher
from accelerate.utils import DistributedType, extract_model_from_parallel
from transformers import Trainer, TrainerCallback
from transformers.integrations import TensorBoardCallback
from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_utils import IntervalStrategy, get_last_checkpoint
from transformers.utils import logging

from .causal_lm_loss import ChunkedNextTokenLoss, check_sharding
from .reference import ReferenceModel, ShardReferenceCallback
from .seeding import SetEpochCallback
from .task_losses import (
    HOST_TARGET_COLUMNS,
    HostTargets,
    TargetPositionsHead,
    TaskTargets,
    next_token_targets,
    per_target_losses,
    reduce_by_task,
)
from .task_metrics import TASK_METRICS_NAME, merge_task_metrics, truncate_task_metrics
from .task_sampling import ImportanceWeighting, TaskSamplingCallback, TaskSamplingSchedule, TaskSamplingWeighting
from .training_args import MinimaxTrainingArguments
from .weighting import Weighting

logger = logging.get_logger(__name__)

WEIGHTING_STATE_NAME = "weighting_state.json"
#: how long the exit handler releases the GIL for the process group's threads to finish their last work
WORKER_DRAIN_SECONDS = 0.2
#: batch columns kept whatever the model's ``forward`` accepts (``labels`` go with ``task_ids``, never to the model)
TASK_COLUMNS = ("labels", "shift_labels", "task_ids", "token_task_ids", "word_ids", "special_tokens_mask")


class MinimaxTrainer(Trainer):
    """``Trainer`` whose loss is ``sum_t w_t L_t`` with weights from a :mod:`robust_pretrain.weighting` strategy.

    Batches carry ``labels`` and ``task_ids`` (token-level, same shape as ``labels``, or one id per example; ``-100``
    marks a non-target; another negative id on a labelled element, an id >= T or a label outside the logits' classes
    is an error). Alternatively the model returns ``task_losses`` (a dict task name ->
    mean loss of this micro-batch) and optionally ``task_counts``; then each micro-batch's task means are pooled over
    processes (exactly, with the counts) and averaged over micro-batches, and the step's weights come from the first
    micro-batch (with accumulation, a task missing from it gets no weight in that step, and ``step_weights`` holds the
    effective weights ``k_t / GA * w_t``, see the module docstring). Pass ``weighting=`` to use a strategy instance
    instead of the one the arguments describe. A causal LM (:func:`is_causal_lm`) learns next-token targets: labels
    are shifted as its own loss shifts them, token-level ``task_ids`` with them (a target's task is the predicted
    token's).
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
            self.add_callback(_LearnableWeightsCallback(self))
        self.add_callback(_LogLastStepCallback())
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
            self.num_tasks, self.args.gradient_accumulation_steps, fixed_weights=self.args.task_sampling_weights
        )
        if self.train_dataset is not None:
            self.train_dataset = sample_tasks(schedule, self.train_dataset, self.args)
        self.add_callback(TaskSamplingCallback(schedule))
        return schedule

    def _sampling_objective(self, strategy: Weighting) -> Weighting:
        """The objective under ``task_sampling``: the strategy's own (none, fixed), the plain mean with the strategy
        drawing (online), or the importance-weighted strategy (fixed with ``importance_weighting``)."""
        if self.args.task_sampling == "online":
            return TaskSamplingWeighting(strategy, self.task_schedule)
        if self.args.importance_weighting:
            return ImportanceWeighting(strategy, self.args.task_sampling_weights)
        return strategy

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
        """The Trainer's, its collator wrapped in :class:`~robust_pretrain.task_losses.HostTargets`: each batch's
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

    # ---------------------------------------------------------------------------------------------------- loss
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
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

    def _unique_rows(self, inputs: dict[str, Any]) -> int | None:
        """How many leading rows of this eval batch are not repeats added by the distributed sampler (None: no
        process's batch has any, so none runs its forward pass again).

        Uses ``gather_for_metrics``, which drops exactly those repeats from the gathered rows of the last batch.
        """
        if self.accelerator.num_processes == 1:
            return None
        size = batch_size(inputs)
        rank = self.accelerator.process_index
        owners = self.accelerator.gather_for_metrics(torch.full((size,), rank, device=self.args.device))
        return None if owners.numel() == size * self.accelerator.num_processes else int((owners == rank).sum())

    def _reference_sums(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The reference model's per-task loss sums on this micro-batch's targets (no gradient); with
        ``excess_clipping='token'`` the sums of ``min(l, l_ref)`` per target (``l``: the trained model's loss on this
        micro-batch), whose mean subtracted from the mean of ``l`` is DoReMi's ``mean of max(l - l_ref, 0)``."""
        with torch.no_grad():
            return self._task_sums(self.reference.model, inputs, reference=True)[0]

    def _task_sums(
        self, model: torch.nn.Module, inputs: dict[str, Any], reference: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward pass; returns per-task loss sums (with gradient), target counts and the model outputs.
        ``reference``: ``model`` is the reference model (its own target-only head)."""
        inputs = dict(inputs)  # the caller's batch stays intact (prediction_step reads its labels)
        task_ids = inputs.pop("task_ids", None)
        if task_ids is None:
            outputs = model(**inputs)
            task_losses = outputs.get("task_losses") if isinstance(outputs, dict) else None
            if task_losses is None:
                raise ValueError(
                    "MinimaxTrainer needs `task_ids` in every batch (with `labels`) or a model that returns "
                    "`task_losses` (a dict task name -> loss)"
                )
            if self.label_smoother is not None:
                raise ValueError(
                    "label_smoothing_factor: the model computes its own `task_losses`; smooth its targets in the model"
                )
            if reference and self.weighting.excess_clipping == "token":
                raise ValueError(
                    "excess_clipping='token' clips per target, and this model returns per-task `task_losses` only: "
                    "use excess_clipping='domain'"
                )
            return (*self._sums_from_dict(task_losses, outputs.get("task_counts")), outputs)
        if "labels" not in inputs:
            raise ValueError("batch has `task_ids` but no `labels`")
        targets = self._task_targets({**inputs, "task_ids": task_ids})
        labels = targets.labels
        for column in ("labels", "shift_labels", *HOST_TARGET_COLUMNS):  # targets never go to the model
            inputs.pop(column, None)
        head = self.reference.head if reference else self.mlm_head
        sparse = (
            head is not None
            and not self._collecting_predictions  # user code gets logits in the layout of the labels
            and labels.shape == inputs.get("input_ids", labels).shape
        )
        smoothing = self.label_smoother.epsilon if self.label_smoother is not None else 0.0
        lm_loss = self.reference_lm_loss if reference else self.lm_loss
        chunked = lm_loss is not None and not self._collecting_predictions
        if chunked:  # the model returns the logits of its first position only
            context = lm_loss.targets(targets.mask, targets.gather(labels), smoothing, targets.positions)
        else:
            context = head.select(targets.mask, targets.positions) if sparse else nullcontext()
        with context:
            outputs = model(**inputs)
        if chunked:
            losses = lm_loss.losses(outputs)
        else:
            if isinstance(outputs, dict) and "logits" not in outputs:
                raise ValueError(
                    f"{type(model).__name__} returned no `logits` (its outputs: {sorted(outputs)}): MinimaxTrainer "
                    "needs them for batches with `labels` and `task_ids`, or per-task losses as `task_losses`"
                )
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
            if logits.shape[:-1] == labels.shape:
                logits = targets.gather(logits)
            elif logits.shape[0] != targets.positions.numel():
                raise ValueError(f"logits of shape {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
            losses = per_target_losses(logits, targets.gather(labels), smoothing)
        if not reference:
            self._target_losses = losses.detach()  # the per-token side of excess_clipping='token'
        elif self.weighting.excess_clipping == "token":
            losses = torch.minimum(losses, self._target_losses.to(losses.dtype))
        sums, counts = reduce_by_task(losses, targets.ids, self.num_tasks, self.args.full_determinism)
        return sums, counts, outputs

    def _targets(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's targets in the layout of the logits, and their task ids (next-token targets for a causal LM)."""
        if not self.causal_lm:
            if "shift_labels" in batch:
                raise ValueError("batch has `shift_labels`, which only a causal LM's next-token loss uses")
            return batch["labels"], batch["task_ids"]
        return next_token_targets(batch["labels"], batch["task_ids"], batch.get("shift_labels"))

    def _sums_from_dict(
        self, task_losses: dict[str, torch.Tensor], task_counts: dict[str, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        unknown = set(task_losses) - set(self.task_names)
        if unknown:
            raise ValueError(f"model returned losses for unknown tasks {sorted(unknown)}; task_names={self.task_names}")
        device = next(iter(task_losses.values())).device if task_losses else self.args.device
        counts = [float((task_counts or {}).get(name, 1.0)) if name in task_losses else 0.0 for name in self.task_names]
        for name, count in zip(self.task_names, counts, strict=True):
            if not (math.isfinite(count) and count >= 0):
                raise ValueError(f"task_counts[{name!r}] must be a finite number >= 0, got {count}")
        # a task with count 0 is absent: its loss (the mean of an empty selection: NaN) must not enter as NaN * 0
        sums = torch.stack(
            [
                task_losses[name].float().reshape(()) * count if count > 0 else torch.zeros((), device=device)
                for name, count in zip(self.task_names, counts, strict=True)
            ]
        )
        return sums, torch.tensor(counts, device=device)

    def _weighted_objective(
        self, sums: torch.Tensor, counts: torch.Tensor, reference_sums: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This micro-batch's share of the step's objective; ``reference_sums``: the reference model's per-task loss
        sums on the same targets (first micro-batch only). Host synchronisation: one device->host transfer at the
        step's first micro-batch (the weighting's inputs), one at its last (the later micro-batches' finiteness and,
        for a ``task_losses`` model, task presence), none in between."""
        step_counts = self._step_counts
        per_micro_batch = step_counts is None  # dict-returning model: counts are only known after the forward pass
        if per_micro_batch:
            step_counts = self._all_reduce(counts.detach().float()) * self.current_gradient_accumulation_steps
        step_counts = step_counts.to(sums.device)
        present = step_counts > 0
        regularizer = None
        if self._micro_index == 0:
            parts = [sums.detach().float(), counts.float()]
            pooled = self._all_reduce(torch.cat(parts if reference_sums is None else [*parts, reference_sums.float()]))
            host = torch.cat([pooled, step_counts.float()]).cpu()  # the step's one transfer of the weighting inputs
            pooled_sums, pooled_counts = host[: self.num_tasks], host[self.num_tasks : 2 * self.num_tasks]
            host_step_counts = host[-self.num_tasks :]
            observed = pooled_counts > 0
            means = torch.where(observed, pooled_sums / pooled_counts.clamp_min(1), math.nan)
            self._check_finite(means, observed)
            extra: dict[str, torch.Tensor] = {}
            if reference_sums is not None:  # the reference model's means on the same targets (checked on the host)
                reference_means = host[2 * self.num_tasks : 3 * self.num_tasks] / pooled_counts.clamp_min(1)
                extra["reference_losses"] = torch.where(observed, reference_means, math.nan)
            grad_norms = self._task_grad_norms(sums, counts) if self.weighting.needs_grad_norms else None
            host_present = host_step_counts > 0
            self._rule_weights = (
                self.weighting.weights(
                    means, host_present, observed, grad_norms=grad_norms, task_counts=host_step_counts, **extra
                )
                .detach()
                .cpu()
            )
            self._device_rule_weights = self._rule_weights.to(sums.device, non_blocking=True)
            if per_micro_batch:  # effective weight: w_t / GA for each micro-batch where task t is present
                self.step_weights = self._rule_weights * host_present / self.current_gradient_accumulation_steps
            else:
                self.step_weights = self._rule_weights
            self._later_nonfinite = torch.zeros(self.num_tasks, dtype=torch.bool, device=sums.device)
            self._later_presence = torch.zeros(self.num_tasks, device=sums.device)
            regularizer = self.weighting.regularizer(host_present)
        else:
            self._later_nonfinite |= (counts > 0) & ~torch.isfinite(sums.detach() / counts.clamp_min(1))
            self._later_presence += present
            if self._micro_index == self.current_gradient_accumulation_steps - 1:
                self._check_later_micro_batches(per_micro_batch)
        self._micro_index += 1
        weights = self.weighting.differentiable_weights(self._device_rule_weights, present)
        loss = (weights * sums / step_counts.clamp_min(1)).sum() * self.accelerator.num_processes
        return loss if regularizer is None else loss + regularizer

    def _check_later_micro_batches(self, per_micro_batch: bool) -> None:
        """At the step's last micro-batch (before its backward pass): one transfer of the later micro-batches'
        non-finite task flags and, for a ``task_losses`` model, of the number of them each task was present in
        (effective weight ``w_t * k_t / GA``, see the module docstring)."""
        host = torch.cat([self._later_nonfinite.float(), self._later_presence]).cpu()
        nonfinite, presence = host.split(self.num_tasks)
        self._check_finite(torch.where(nonfinite > 0, math.nan, 0.0), nonfinite > 0)
        if per_micro_batch:
            self.step_weights = self.step_weights + self._rule_weights * presence / (
                self.current_gradient_accumulation_steps
            )

    def _check_finite(self, task_means: torch.Tensor, observed: torch.Tensor) -> None:
        """Raise ``FloatingPointError`` naming the observed tasks whose mean loss is not finite (host tensors)."""
        bad = observed & ~torch.isfinite(task_means)
        if bad.any():
            names = [self.task_names[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise FloatingPointError(
                f"non-finite loss for task(s) {names} at optimizer step {self.state.global_step + 1}"
            )

    def _task_grad_norms(self, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Norm of each task's mean-loss gradient w.r.t. the shared module, averaged over the processes that measured
        it (GradNorm); NaN for a task no process saw in this micro-batch."""
        params = self._shared_parameters()
        norms = torch.zeros(self.num_tasks, device=sums.device)
        for t in torch.nonzero(counts > 0).flatten().tolist():
            grads = torch.autograd.grad(sums[t] / counts[t], params, retain_graph=True, allow_unused=True)
            norms[t] = torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None))
        pooled = self._all_reduce(torch.cat([norms, (counts > 0).float()]))
        measured = pooled[self.num_tasks :]
        return torch.where(measured > 0, pooled[: self.num_tasks] / measured.clamp_min(1), math.nan)

    def _shared_parameters(self) -> list[torch.nn.Parameter]:
        if self._shared_params is None:
            model = self.accelerator.unwrap_model(self.model)
            name = self.args.gradnorm_shared_module or last_encoder_layer(model)
            modules = dict(model.named_modules())
            if name not in modules:
                raise ValueError(f"gradnorm_shared_module: the model has no module named {name!r}")
            self._shared_params = [p for p in modules[name].parameters() if p.requires_grad]
            if not self._shared_params:
                raise ValueError(f"gradnorm_shared_module: module {name!r} has no trainable parameters")
        return self._shared_params

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor.to(self.args.device), reduction="sum")

    # ------------------------------------------------------------------------------------------- eval / logging
    def evaluation_loop(
        self,
        dataloader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ):
        """The Trainer's loop, plus per-task losses, their mean and the worst task's loss.

        When predictions are collected (for ``compute_metrics`` or ``predict``) the MLM head computes full-size
        logits, so ``preprocess_logits_for_metrics`` and ``compute_metrics`` see them in the layout of the labels.
        """
        self._eval_sums.zero_()
        loss_only = self.args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
        self._collecting_predictions = not loss_only
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        finally:
            self._collecting_predictions = False
        output.metrics.update(self.task_metrics(self._all_reduce(self._eval_sums).cpu(), metric_key_prefix))
        return output

    def task_metrics(self, pooled: torch.Tensor, prefix: str) -> dict[str, float]:
        """``{prefix}_task_loss/<name>``, ``{prefix}_mean_task_loss`` and ``{prefix}_worst_task_loss``; for a causal LM
        also ``{prefix}_task_perplexity/<name>`` and ``{prefix}_worst_task_perplexity`` (exp of the mean token loss)."""
        sums, counts = pooled[: self.num_tasks], pooled[self.num_tasks :]
        losses = {name: float(sums[i] / counts[i]) for i, name in enumerate(self.task_names) if counts[i] > 0}
        metrics = {f"{prefix}_task_loss/{name}": value for name, value in losses.items()}
        if losses:
            metrics[f"{prefix}_mean_task_loss"] = sum(losses.values()) / len(losses)
            metrics[f"{prefix}_worst_task_loss"] = max(losses.values())
        if losses and self.causal_lm:
            metrics.update({f"{prefix}_task_perplexity/{name}": perplexity(loss) for name, loss in losses.items()})
            metrics[f"{prefix}_worst_task_perplexity"] = perplexity(max(losses.values()))
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and "eval_loss" not in logs:
            pooled = self._all_reduce(self._train_sums.clone()).cpu()
            self._train_sums.zero_()
            sums, counts = pooled[: self.num_tasks], pooled[self.num_tasks :]
            if self.num_tasks <= self.args.max_logged_tasks:
                logs.update(self._per_task_logs(sums, counts))
            else:
                logs.update(self._task_summary(sums, counts))
                self._write_task_metrics(sums, counts)
            logs.update(self._sampling_logs())
            logs.update(self.weighting.log_values())  # e.g. minimax_alpha
            if self.lm_loss is not None and self.lm_loss.last_chunk_size is not None:
                logs["causal_lm_chunk_size"] = self.lm_loss.last_chunk_size  # the last forward pass's
        super().log(logs, start_time)

    def _per_task_logs(self, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
        """``task_loss/<name>`` (tasks with targets since the last log) and ``task_weight/<name>``, rounded to 6
        digits: one tensor-to-list conversion each, whatever T is."""
        loss_keys = [f"task_loss/{name}" for name in self.task_names]
        weight_keys = [f"task_weight/{name}" for name in self.task_names]
        losses = (sums / counts.clamp_min(1)).tolist()
        logs = {key: round(loss, 6) for key, loss, n in zip(loss_keys, losses, counts.tolist(), strict=True) if n > 0}
        logs.update(zip(weight_keys, (round(w, 6) for w in self.step_weights.tolist()), strict=True))
        return logs

    def _sampling_logs(self) -> dict[str, float]:
        """With ``task_sampling``: the step's sampling weights (normalised), ``task_sampling_weight/<name>``
        (``task_weight/<name>`` are the objective's), or beyond ``max_logged_tasks`` their effective number
        ``exp(H)`` (``task_sampling_weight_effective_number``)."""
        weights = None if self.task_schedule is None else self.task_schedule.weights_at(self.state.global_step)
        if weights is None:
            return {}
        p = weights / weights.sum()
        if self.num_tasks <= self.args.max_logged_tasks:
            keys = (f"task_sampling_weight/{name}" for name in self.task_names)
            return dict(zip(keys, (round(w, 6) for w in p.tolist()), strict=True))
        entropy = float(-(p * p.clamp_min(1e-300).log()).sum())
        return {"task_sampling_weight_effective_number": round(math.exp(entropy), 4)}

    def _task_summary(self, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, Any]:
        """The compact log of a run with more than ``max_logged_tasks`` tasks: ``worst_task`` (name),
        ``worst_task_loss`` and ``mean_task_loss`` over the tasks with targets since the last log, and the entropy
        (nats) and effective number ``exp(entropy)`` of the step's task weights normalised to sum to 1."""
        summary: dict[str, Any] = {}
        measured = counts > 0
        if bool(measured.any()):
            losses = torch.where(measured, sums / counts.clamp_min(1), -math.inf)
            worst = int(losses.argmax())
            summary["worst_task"] = self.task_names[worst]
            summary["worst_task_loss"] = round(float(losses[worst]), 6)
            summary["mean_task_loss"] = round(float(losses[measured].mean()), 6)
        weights = self.step_weights.double().clamp_min(0)
        if float(weights.sum()) > 0:
            p = weights / weights.sum()
            entropy = float(-(p * p.clamp_min(1e-300).log()).sum())
            summary["task_weight_entropy"] = round(entropy, 6)
            summary["task_weight_effective_number"] = round(math.exp(entropy), 4)
        return summary

    def task_log_history(self) -> list[dict[str, Any]]:
        """The log history with every task's ``task_loss/<name>`` and ``task_weight/<name>``: as logged, or, when
        ``T > max_logged_tasks`` kept them out of the logs, merged in from ``task_metrics.jsonl`` by step."""
        path = os.path.join(self.args.output_dir, TASK_METRICS_NAME)
        history = self.state.log_history
        if not os.path.isfile(path) or any(f"task_weight/{self.task_names[0]}" in entry for entry in history):
            return history
        return merge_task_metrics(history, path, self.task_names)

    def _write_task_metrics(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Append ``{"step", "task_loss", "task_weight"}`` to ``task_metrics.jsonl`` in ``output_dir`` (main process
        only), the values in task-id order as the per-task logs would give them (``null``: no targets since the last
        log) after a first line ``{"task_names": [...]}``; and send them to TensorBoard when its callback is active.
        The first write of a ``train()`` call drops the lines after the step it started from, so a resumed run neither
        duplicates nor loses lines."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, TASK_METRICS_NAME)
        if getattr(self, "_task_metrics_state", None) is not self.state:  # first write of this train() call
            self._task_metrics_state = self.state
            truncate_task_metrics(path, getattr(self, "_initial_global_step", 0))
            if not os.path.isfile(path):
                os.makedirs(self.args.output_dir, exist_ok=True)
                with open(path, "w") as stream:
                    stream.write(json.dumps({"task_names": self.task_names}) + "\n")
        step = self.state.global_step
        losses = [
            round(loss, 6) if n > 0 else None
            for loss, n in zip((sums / counts.clamp_min(1)).tolist(), counts.tolist(), strict=True)
        ]
        weights = [round(weight, 6) for weight in self.step_weights.tolist()]
        with open(path, "a") as stream:
            stream.write(json.dumps({"step": step, "task_loss": losses, "task_weight": weights}) + "\n")
        for callback in self.callback_handler.callbacks:
            writer = getattr(callback, "tb_writer", None)
            if writer is not None and isinstance(callback, TensorBoardCallback):
                for name, loss, weight in zip(self.task_names, losses, weights, strict=True):
                    if loss is not None:
                        writer.add_scalar(f"train/task_loss/{name}", loss, step)
                    writer.add_scalar(f"train/task_weight/{name}", weight, step)

    # ------------------------------------------------------------------------------------ optimizer / checkpoints
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

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model as the Trainer does, plus ``weighting_state.json`` (the strategy's state, JSON).

        Under FSDP with sharded checkpoints (``SHARDED_STATE_DICT``) the Trainer writes no model outside
        checkpoints; a direct call (the final model) gathers the full weights into ``model.safetensors`` instead.
        """
        plugin = self.accelerator.state.fsdp_plugin if self.is_fsdp_enabled else None
        sharded = plugin is not None and "SHARDED" in str(plugin.state_dict_type)
        if sharded and not _internal_call:
            plugin.set_state_dict_type("FULL_STATE_DICT")
            try:
                super().save_model(output_dir, _internal_call)
            finally:
                plugin.set_state_dict_type("SHARDED_STATE_DICT")
        else:
            super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            directory = output_dir or self.args.output_dir
            os.makedirs(directory, exist_ok=True)  # sharded FSDP checkpoints: the model files come later
            path = os.path.join(directory, WEIGHTING_STATE_NAME)
            state = {
                "task_names": self.task_names,
                "weighting": self.args.weighting,
                "options": self.weighting.options(),
                "step_weights": self.step_weights.tolist(),
                "state": self.weighting.state_dict(),
            }
            with open(path, "w") as f:
                json.dump(state, f, indent=1)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write ``card_renderer``'s card if one is set (``push_to_hub`` calls this too), else the Trainer's card."""
        if self.card_renderer is None:
            super().create_model_card(*args, **kwargs)
        elif self.is_world_process_zero():
            self.card_renderer()

    def load_weighting_state(self, checkpoint_dir: str) -> None:
        """Restore the strategy's state from a checkpoint written by :meth:`save_model`."""
        path = os.path.join(checkpoint_dir, WEIGHTING_STATE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: {checkpoint_dir} was not written by MinimaxTrainer")
        with open(path) as f:
            state = json.load(f)
        if state["task_names"] != self.task_names:
            raise ValueError(f"checkpoint tasks {state['task_names']} differ from task_names {self.task_names}")
        saved, current = state.get("options"), self.weighting.options()
        if saved is None:
            logger.warning(f"{path} predates saved weighting options: cannot check that this run uses the same ones")
        elif saved != current:
            differ = [name for name in dict.fromkeys([*current, *saved]) if saved.get(name) != current.get(name)]
            raise ValueError(
                f"{checkpoint_dir} was trained with "
                + ", ".join(f"{name}={saved.get(name)!r}" for name in differ)
                + "; this run has "
                + ", ".join(f"{name}={current.get(name)!r}" for name in differ)
                + ": resume with the checkpoint's weighting options, or train into a new output_dir"
            )
        self.weighting.load_state_dict(state["state"])
        self.step_weights = torch.tensor(state["step_weights"])

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial=None,
        ignore_keys_for_eval: list[str] | None = None,
    ):
        """``Trainer.train``; when resuming, the weighting state is restored from the checkpoint first."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
        if isinstance(checkpoint, str):
            self.load_weighting_state(checkpoint)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval)


@functools.cache  # registered once per process
def register_process_group_teardown() -> None:
    """Destroy the default process group, if one is alive, at interpreter exit (whoever created it, e.g. Accelerate
    for the Trainer's arguments). ``MinimaxTrainer`` registers it; scripts training with the plain ``Trainer`` call it.

    Left alive, a gloo worker thread may still be releasing its last work (which holds Python tensors) when the
    interpreter finalises; it cannot take the GIL then, and the finished process aborts (``terminate called without an
    active exception``, exit -6): torchrun reports a failure. So the group is destroyed and the GIL released briefly
    while the interpreter is alive, letting those threads finish; freeing the group here (a garbage collection) could
    deadlock instead, its destructor joining a thread that waits for the GIL.
    """
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        time.sleep(WORKER_DRAIN_SECONDS)


class _LogLastStepCallback(TrainerCallback):
    """Logs the last optimizer step when ``max_steps`` is not a multiple of ``logging_steps`` (its task weights and
    losses would otherwise be missing from the log history and the trajectory plot)."""

    def on_step_end(self, args, state, control, **kwargs):
        if args.logging_strategy == IntervalStrategy.STEPS and state.global_step >= state.max_steps > 0:
            control.should_log = True


class _LearnableWeightsCallback(TrainerCallback):
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


def is_causal_lm(model: torch.nn.Module) -> bool:
    """Whether ``model``'s own loss shifts its labels (next-token prediction), decided as transformers decides it: a
    class (or base class) in the ``AutoModelForCausalLM`` mapping (the Trainer's label-smoothing rule) or a
    ``loss_type`` whose loss is ``ForCausalLMLoss`` (its ``num_items_in_batch`` rule), and not an encoder-decoder.

    Looks through DDP/FSDP/DeepSpeed/compile wrappers and peft (``get_base_model``). A custom causal model outside the
    mapping declares itself with ``model.loss_type = "ForCausalLM"``.
    """
    model = extract_model_from_parallel(model, keep_torch_compile=False)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    in_mapping = any(cls.__name__ in causal_names for cls in type(model).__mro__)
    return in_mapping or LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss


def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` where it overflows a float."""
    return math.exp(loss) if loss < math.log(sys.float_info.max) else math.inf


def batch_size(inputs: dict[str, Any]) -> int:
    """Leading dimension of the batch's first tensor."""
    return next(v.shape[0] for v in inputs.values() if torch.is_tensor(v) and v.dim())


def first_rows(inputs: dict[str, Any], rows: int) -> dict[str, Any]:
    """The batch restricted to its first ``rows`` examples (tensors sharing the batch dimension are sliced)."""
    size = batch_size(inputs)
    return {k: v[:rows] if torch.is_tensor(v) and v.dim() and v.shape[0] == size else v for k, v in inputs.items()}


def last_encoder_layer(model: torch.nn.Module) -> str:
    """Dotted name of the last block of the longest ``...layer.N`` / ``layers.N`` / ``h.N`` / ``block.N`` stack."""
    stacks: dict[str, int] = {}
    for name, _ in model.named_modules():
        match = re.fullmatch(r"(.*\.(?:layer|layers|h|block|blocks))\.(\d+)", name)
        if match:
            stacks[match.group(1)] = max(stacks.get(match.group(1), -1), int(match.group(2)))
    if not stacks:
        raise ValueError("gradnorm_shared_module: no encoder layer stack found; name the shared module explicitly")
    prefix = max(stacks, key=lambda k: stacks[k])
    return f"{prefix}.{stacks[prefix]}"
