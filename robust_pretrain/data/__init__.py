"""Part-of-speech task data: tagging, task specification, preprocessing, task-grouped MLM collation, corpus.

Pipeline: raw text -> :func:`tokenize_and_tag` (word tokenizer + PoS tagger + fast tokenizer) ->
:class:`TaskGroupedMLMCollator` -> batches with ``labels`` and per-target ``task_ids`` for the trainer.
The collator (and torch) loads lazily, on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robust_pretrain.data.corpus import load_ewt_corpus
from robust_pretrain.data.preprocessing import tokenize_and_tag
from robust_pretrain.data.taggers import get_tagger
from robust_pretrain.data.tasks import DEFAULT_POS_TASKS, UPOS_TAGS, TaskSpec

if TYPE_CHECKING:
    from robust_pretrain.data.collator import TaskGroupedMLMCollator

__all__ = [
    "DEFAULT_POS_TASKS",
    "UPOS_TAGS",
    "TaskGroupedMLMCollator",
    "TaskSpec",
    "get_tagger",
    "load_ewt_corpus",
    "tokenize_and_tag",
]


def __getattr__(name: str) -> Any:
    if name == "TaskGroupedMLMCollator":
        from robust_pretrain.data import collator

        return getattr(collator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
