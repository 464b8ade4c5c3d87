"""Per-task loss sums and counts from a single forward pass."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def target_task_ids(labels: torch.Tensor, task_ids: torch.Tensor, num_tasks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(mask, ids)``: which elements of ``labels`` are targets, and the task id of each target.

    ``task_ids`` is either token-level (same shape as ``labels``) or example-level (shape ``[batch]``, broadcast over
    the remaining label dimensions). A target is an element whose task id is ``>= 0`` and, for integer labels, whose
    label is not ``-100``.
    """
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
    ids = task_ids[mask]
    if ids.numel() and int(ids.max()) >= num_tasks:
        raise ValueError(f"task id {int(ids.max())} is out of range for {num_tasks} tasks")
    return mask, ids


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
    return F.cross_entropy(logits.float(), labels, reduction="none", label_smoothing=label_smoothing)


def reduce_by_task(losses: torch.Tensor, task_ids: torch.Tensor, num_tasks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the per-target losses and count the targets of each task (scatter-add), both of shape ``[num_tasks]``."""
    sums = losses.new_zeros(num_tasks).index_add(0, task_ids, losses)
    counts = torch.bincount(task_ids, minlength=num_tasks).to(losses.dtype)
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
        return (hidden[self._mask], *args[1:])

    @contextmanager
    def select(self, mask: torch.Tensor | None) -> Iterator[None]:
        """Within the block, the head sees only the rows where ``mask`` is true."""
        self._mask = mask
        try:
            yield
        finally:
            self._mask = None

    def remove(self) -> None:
        self._handle.remove()
