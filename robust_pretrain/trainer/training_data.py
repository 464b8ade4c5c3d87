"""Checks of the training data that cost no device synchronisation: read once, on the host, from the columns of a
``datasets.Dataset`` before training (other datasets, e.g. streams, pass unchecked)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset
from transformers.utils import logging

logger = logging.get_logger(__package__)

IGNORE_INDEX = -100


def _flat(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The values of a (possibly nested) list column."""
    while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    return column


def check_training_data(dataset: Any, task_names: list[str]) -> None:
    """Refuse training data whose every label is ``-100`` (nothing to train on: the loss would be 0 throughout);
    warn about tasks without any example in the ``task_ids`` column (they would train at weight 0, the worst case
    being over the others). Only a ``datasets.Dataset`` is read; labels made by the collator are not seen here."""
    if not isinstance(dataset, Dataset) or len(dataset) == 0:
        return
    columns = dataset.with_format("arrow")
    if "labels" in dataset.column_names:
        labels = _flat(columns["labels"])
        if labels.null_count < len(labels) and pc.all(pc.equal(labels, IGNORE_INDEX)).as_py():
            raise ValueError("labels: every label of the training data is -100 (ignored): there is nothing to train on")
    if "task_ids" in dataset.column_names:
        ids = set(pc.unique(_flat(columns["task_ids"])).to_pylist())
        missing = [name for t, name in enumerate(task_names) if t not in ids]
        if missing:
            logger.warning(
                "task(s) %s: no example in the training data (task_ids): they train at weight 0 and the worst case "
                "is over the other tasks only",
                ", ".join(missing),
            )
