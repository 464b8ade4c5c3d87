"""The best plain-HF practice the benchmarks compare against: a BERT masked LM with sparse prediction, and a decoder's
checkpointed chunked loss.

``SparsePredictionBertForMaskedLM`` is ``BertForMaskedLM`` whose forward gathers the hidden states where
``labels != -100`` before the MLM head (Google BERT's ``gather_indexes``, ModernBERT's sparse prediction), so
vocabulary logits are computed at the target positions only; its loss is the mean cross-entropy over those targets,
the same number ``BertForMaskedLM`` returns (with the Trainer's ``num_items_in_batch``: the sum over the step's
targets, as HF's loss functions take it). It trains with the plain ``Trainer``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import BertForMaskedLM, Trainer
from transformers.modeling_outputs import MaskedLMOutput


class SparsePredictionBertForMaskedLM(BertForMaskedLM):
    """``BertForMaskedLM`` computing logits only where ``labels != -100`` (``[num_targets, vocab]``)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        hidden = self.bert(input_ids, attention_mask=attention_mask).last_hidden_state
        if labels is None:
            return MaskedLMOutput(logits=self.cls(hidden))
        targets = labels != -100
        logits = self.cls(hidden[targets])
        losses = F.cross_entropy(logits.float(), labels[targets], reduction="none")
        # the Trainer's convention: with the step's target count given, the sum over it (exact under accumulation)
        loss = losses.mean() if num_items_in_batch is None else losses.sum() / num_items_in_batch
        return MaskedLMOutput(loss=loss, logits=logits)


class CheckpointedChunkedLossTrainer(Trainer):
    """The decoder alternative a user writes in a few lines: the plain ``Trainer`` whose causal-LM loss applies
    ``lm_head`` to ``chunk`` positions at a time under ``torch.utils.checkpoint`` (one chunk's logits alive in the
    forward pass, recomputed in the backward pass), the mean over the batch's targets; under ``bf16`` autocast,
    which it enters itself (``model.model`` and ``lm_head`` bypass the autocast Accelerate wraps around forward)."""

    def __init__(self, *args, chunk: int = 2048, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chunk = chunk

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        with torch.autocast(labels.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            hidden = model.model(**inputs).last_hidden_state[:, :-1].flatten(0, 1)
        targets = labels[:, 1:].flatten()

        def summed(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model.lm_head(h).float(), y, ignore_index=-100, reduction="sum")

        with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            total = sum(
                checkpoint(summed, hidden[i : i + self.chunk], targets[i : i + self.chunk], use_reentrant=False)
                for i in range(0, targets.numel(), self.chunk)
            )
        loss = total / (targets != -100).sum()
        return (loss, None) if return_outputs else loss


class LinearCrossEntropyTrainer(Trainer):
    """The plain ``Trainer`` whose causal-LM loss is PyTorch's ``F.linear_cross_entropy`` (torch >= 2.13), chunked
    (``LinearCrossEntropyOptions()``: the batch in chunks, gradients computed in the forward pass), reduction
    ``mean`` over the batch's targets: the op a user reaches for first. Autocast as
    :class:`CheckpointedChunkedLossTrainer`."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        with torch.autocast(labels.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
            hidden = model.model(**inputs).last_hidden_state[:, :-1].flatten(0, 1)
            loss = F.linear_cross_entropy(
                hidden,
                model.lm_head.weight,
                labels[:, 1:].flatten(),
                reduction="mean",
                options=torch.nn.LinearCrossEntropyOptions(),
            )
        return (loss, None) if return_outputs else loss
