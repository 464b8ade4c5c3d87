"""The best plain-HF practice the benchmarks compare against: a BERT masked LM with sparse prediction.

``SparsePredictionBertForMaskedLM`` is ``BertForMaskedLM`` whose forward gathers the hidden states where
``labels != -100`` before the MLM head (Google BERT's ``gather_indexes``, ModernBERT's sparse prediction), so
vocabulary logits are computed at the target positions only; its loss is the mean cross-entropy over those targets,
the same number ``BertForMaskedLM`` returns (with the Trainer's ``num_items_in_batch``: the sum over the step's
targets, as HF's loss functions take it). It trains with the plain ``Trainer``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertForMaskedLM
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
