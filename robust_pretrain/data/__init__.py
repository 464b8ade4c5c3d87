"""Task data: part-of-speech tasks for masked LMs and data domains for decoders.

Masked LM: raw text -> :func:`tokenize_and_tag` (word tokenizer + PoS tagger + fast tokenizer) ->
:class:`TaskGroupedMLMCollator` -> batches with ``labels`` and per-target ``task_ids`` for the trainer.
Decoder: ``{domain: texts}`` -> :func:`train_bpe_tokenizer` (from scratch) and :func:`pack_domain_texts` (sequences
within one domain) -> :class:`DomainCollator` (per-sequence ``task_ids``; draws the domains under ``task_sampling``).
The collators, packing and tokenizer training (and torch) load lazily, on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robust_pretrain.data.corpus import load_ewt_corpus
from robust_pretrain.data.preprocessing import tokenize_and_tag
from robust_pretrain.data.taggers import get_tagger
from robust_pretrain.data.tasks import DEFAULT_POS_TASKS, UPOS_TAGS, TaskSpec

if TYPE_CHECKING:
    from robust_pretrain.data.bpe import train_bpe_tokenizer
    from robust_pretrain.data.collator import TaskGroupedMLMCollator
    from robust_pretrain.data.domains import DomainCollator, pack_domain_texts

__all__ = [
    "DEFAULT_POS_TASKS",
    "UPOS_TAGS",
    "DomainCollator",
    "TaskGroupedMLMCollator",
    "TaskSpec",
    "get_tagger",
    "load_ewt_corpus",
    "pack_domain_texts",
    "tokenize_and_tag",
    "train_bpe_tokenizer",
]
_LAZY = {
    "TaskGroupedMLMCollator": "collator",
    "DomainCollator": "domains",
    "pack_domain_texts": "domains",
    "train_bpe_tokenizer": "bpe",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"robust_pretrain.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
