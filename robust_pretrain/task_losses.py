"""Per-task loss sums and counts from a single forward pass."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def refuse_on_device(bad: torch.Tensor, message: str) -> None:
    """Fail if the boolean scalar ``bad`` holds, without a host sync: an asynchronous device assertion, which on the
    CPU is checked at once (``ValueError(message)``) and on an accelerator surfaces at its next synchronisation."""
    try:
        torch._assert_async(~bad, message)
    except RuntimeError as err:  # only the CPU raises here
        raise ValueError(message) from err


def check_class_ids(labels: torch.Tensor, classes: int) -> None:
    """Refuse (:func:`refuse_on_device`: no sync) a target label outside ``0..classes - 1``."""
    refuse_on_device(
        ((labels < 0) | (labels >= classes)).any(),
        f"labels: a target's class id is outside 0..{classes - 1}, the classes of the logits (the vocabulary)",
    )


class TaskTargets:
    """The targets of one micro-batch and their tasks, computed once and shared by the counting, the forward pass and
    the per-task reduction.

    ``task_ids`` is either token-level (same shape as ``labels``) or example-level (shape ``[batch]``, broadcast over
    the remaining label dimensions). A target is an element whose task id is ``>= 0`` and, for integer labels, whose
    label is not ``-100``. Task ids ``>= num_tasks``, and negative ids other than ``-100`` on a labelled element,
    fail a device check (:func:`refuse_on_device`: a ``ValueError`` at once on the CPU, asynchronous elsewhere).

    ``found``: the targets' flat positions and task ids, found (and checked) on the host before the batch was copied
    to the device (:class:`HostTargets`); without them :attr:`positions` costs one device->host synchronisation (the
    number of targets sets the shapes), as for any sparse-prediction head.
    """

    def __init__(
        self,
        labels: torch.Tensor,
        task_ids: torch.Tensor,
        num_tasks: int,
        found: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        if task_ids.is_floating_point() or task_ids.dtype == torch.bool or task_ids.is_complex():
            raise ValueError(f"task_ids must be integers (0..{num_tasks - 1}, or {IGNORE_INDEX}), got {task_ids.dtype}")
        if task_ids.shape != labels.shape:
            if task_ids.dim() != 1 or task_ids.shape[0] != labels.shape[0]:
                raise ValueError(
                    f"task_ids must have the shape of labels {tuple(labels.shape)} (token-level) or "
                    f"[{labels.shape[0]}] (example-level), got {tuple(task_ids.shape)}"
                )
            task_ids = task_ids.view(-1, *([1] * (labels.dim() - 1))).expand_as(labels)
        mask = task_ids >= 0
        if not labels.is_floating_point():
            mask &= labels != IGNORE_INDEX
        self.labels = labels
        self.mask = mask
        self.num_tasks = num_tasks
        if found is not None:
            self.positions, self.ids = found
            return
        refuse_on_device(
            (mask & (task_ids >= num_tasks)).any(), f"task_ids: a target's task id is >= the {num_tasks} tasks"
        )
        labelled = torch.ones_like(mask) if labels.is_floating_point() else labels != IGNORE_INDEX
        refuse_on_device(
            (labelled & (task_ids < 0) & (task_ids != IGNORE_INDEX)).any(),
            f"task_ids: a labelled element has a negative task id other than {IGNORE_INDEX} (ids are 0..{num_tasks - 1}"
            f", or {IGNORE_INDEX} for no target)",
        )
        #: each element's task id, ``num_tasks`` for non-targets (an extra bucket, dropped from the counts)
        self.buckets = torch.where(mask, task_ids, num_tasks).flatten()

    def counts(self) -> torch.Tensor:
        """Targets per task, ``[num_tasks]`` float, counted on the labels' device (no sync)."""
        buckets = self.ids if "ids" in vars(self) else self.buckets
        ones = torch.ones_like(buckets, dtype=torch.float32)
        return ones.new_zeros(self.num_tasks + 1).index_add_(0, buckets, ones)[: self.num_tasks]

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        """Flat indices of the targets (row-major, the order of ``labels[mask]``): unless ``found`` on the host, one
        sync per micro-batch, as for any sparse-prediction head (the number of targets sets the shapes)."""
        return self.mask.flatten().nonzero().squeeze(1)

    @functools.cached_property
    def ids(self) -> torch.Tensor:
        """The task id of each target, in the order of :attr:`positions`."""
        return self.buckets[self.positions]

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """The rows of ``values`` (shaped ``labels.shape + trailing``) at the targets: ``values[mask]`` without a
        boolean mask (an index gather, whose backward is a scatter-add)."""
        trailing = values.shape[self.mask.dim() :]
        return values.reshape(-1, *trailing).index_select(0, self.positions)


#: the batch columns :class:`HostTargets` adds (the targets' flat positions and task ids); never passed to the model
HOST_TARGET_COLUMNS = ("host_target_positions", "host_target_task_ids")


@dataclass
class HostTargets:
    """A data collator that also finds each batch's targets on the host, where the collator runs (CPU, possibly in a
    ``DataLoader`` worker), before the batch is copied to the device: ``MinimaxTrainer`` wraps its training data
    collator with it, so a micro-batch's targets cost no device->host synchronisation.

    A batch with tensor ``labels`` and ``task_ids`` (and, for ``next_token``, optional ``shift_labels``) on the CPU gets
    the :data:`HOST_TARGET_COLUMNS`: the flat positions and task ids of its targets as :class:`TaskTargets` finds
    them (next-token targets, :func:`next_token_targets`, for a causal LM); bad task ids fail here, with
    ``ValueError``. Other batches pass unchanged. ``enabled`` false: every batch passes unchanged (for a data loader
    that splits batches by rows after collation, which would split these columns wrongly).
    """

    collator: Callable[[list[Any]], Any]
    num_tasks: int
    next_token: bool
    enabled: bool = True

    def __call__(self, features: list[Any]) -> Any:
        batch = self.collator(features)
        if not (self.enabled and isinstance(batch, MutableMapping)):
            return batch
        labels, task_ids = batch.get("labels"), batch.get("task_ids")
        shift_labels = batch.get("shift_labels")
        given = [labels, task_ids] + ([] if shift_labels is None else [shift_labels])
        if not all(torch.is_tensor(t) and t.device.type == "cpu" for t in given):
            return batch
        if self.next_token:
            labels, task_ids = next_token_targets(labels, task_ids, shift_labels)
        elif shift_labels is not None:
            return batch  # refused by the trainer: only a causal LM uses shift_labels
        targets = TaskTargets(labels, task_ids, self.num_tasks)
        batch[HOST_TARGET_COLUMNS[0]], batch[HOST_TARGET_COLUMNS[1]] = targets.positions, targets.ids
        return batch


def next_token_targets(
    labels: torch.Tensor, task_ids: torch.Tensor, shift_labels: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The targets of a causal LM's logits, position by position, and their task ids, as ``ForCausalLMLoss`` takes
    them: ``labels`` padded with ``-100`` on the right and shifted left by one (position i predicts token i + 1).

    Token-level ``task_ids`` (the shape of ``labels``) are shifted with the labels, so a target's task is the task of
    the predicted token; example-level ids (``[batch]``) stay as they are. ``shift_labels`` (already shifted targets,
    e.g. from a padding-free collator) are taken as given, with ``task_ids`` aligned with them.
    """
    if shift_labels is not None:
        return shift_labels, task_ids
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    if task_ids.shape == labels.shape:
        task_ids = F.pad(task_ids, (0, 1), value=IGNORE_INDEX)[..., 1:]
    return shifted, task_ids


def per_target_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Unreduced loss of each target in fp32: cross-entropy for class labels, squared error for float labels.

    ``label_smoothing`` eps gives ``(1 - eps) * NLL + eps * mean_v(-log p_v)`` (the Trainer's ``LabelSmoother``).
    """
    if labels.is_floating_point():
        if label_smoothing:
            raise ValueError("label_smoothing_factor applies to class labels; these labels are float targets")
        return (logits.float().reshape(labels.shape) - labels.float()).pow(2)
    check_class_ids(labels, logits.shape[-1])
    return F.cross_entropy(logits.float(), labels, reduction="none", label_smoothing=label_smoothing)


def reduce_by_task(
    losses: torch.Tensor, task_ids: torch.Tensor, num_tasks: int, deterministic: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the per-target losses and count the targets of each task, both of shape ``[num_tasks]``, on the losses'
    device without a sync: by scatter-adds (on a GPU, atomic adds in no fixed order), or with ``deterministic`` by a
    product with the targets' one-hot task matrix (a fixed order: the same bits on every run, as ``--full_determinism``
    needs; ``[targets, num_tasks]`` extra memory)."""
    if deterministic:
        one_hot = torch.nn.functional.one_hot(task_ids, num_tasks).to(losses.dtype)
        return losses @ one_hot, one_hot.sum(dim=0)
    sums = losses.new_zeros(num_tasks).index_add(0, task_ids, losses)
    counts = losses.new_zeros(num_tasks).index_add(0, task_ids, torch.ones_like(losses))
    return sums, counts


def mlm_head_name(model: torch.nn.Module) -> str | None:
    """Name of the child module holding the output embeddings (BERT: ``cls``, RoBERTa: ``lm_head``), if any."""
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    if output is None:
        return None
    for name, child in model.named_children():
        if any(module is output for module in child.modules()):
            return name
    return None


class TargetPositionsHead:
    """Makes a masked-LM head compute vocabulary logits only at target positions.

    A forward pre-hook on the head module (the child of the model that holds the output embeddings, e.g. BERT's
    ``cls``) keeps only the rows of the hidden states selected by :meth:`select`, so the logits come out as
    ``[num_targets, vocab]`` instead of ``[batch, seq, vocab]``. The hook changes nothing in the model's state dict.
    """

    def __init__(self, head: torch.nn.Module) -> None:
        self._mask: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._handle = head.register_forward_pre_hook(self._keep_targets)

    @classmethod
    def attach(cls, model: torch.nn.Module) -> TargetPositionsHead | None:
        """Hook the MLM head of ``model`` (also inside a peft wrapper); ``None`` if it has no output embeddings."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        name = mlm_head_name(base)
        return None if name is None else cls(base.get_submodule(name))

    def _keep_targets(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if self._mask is None or not args or not torch.is_tensor(args[0]):
            return None
        hidden = args[0]
        if hidden.shape[:-1] != self._mask.shape:
            return None
        if self._positions is None:
            return (hidden[self._mask], *args[1:])
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, self._positions), *args[1:])

    @contextmanager
    def select(self, mask: torch.Tensor | None, positions: torch.Tensor | None = None) -> Iterator[None]:
        """Within the block, the head sees only the rows where ``mask`` is true; given ``positions`` (the flat indices
        of those rows, :attr:`TaskTargets.positions`) it gathers them by index, without a boolean mask's sync."""
        self._mask, self._positions = mask, positions
        try:
            yield
        finally:
            self._mask = self._positions = None

    def remove(self) -> None:
        self._handle.remove()
