"""The text of the PoS-MLM pre-training recipe: loading it (UD-EWT, a Hub dataset or local files, streamed or not),
refusing text without task words, and masking it (held-out masks fixed once, training masks per epoch)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, DatasetDict, IterableDataset, load_dataset
from datasets.exceptions import DatasetGenerationError
from transformers import default_data_collator

from robust_pretrain.cli import UsageError
from robust_pretrain.data import TaskGroupedMLMCollator, TaskSpec, load_ewt_corpus, tokenize_and_tag
from robust_pretrain.data.preprocessing import (
    STREAM_POSITION_COLUMN,
    repeat_stream,
    task_word_counts,
    words_per_task,
)
from robust_pretrain.data.tasks import IMPLAUSIBLE_SHARE_FRACTION, JUDGED_MIN_EXPECTED_SHARE
from robust_pretrain.data.text_files import TEXT_BUILDERS, check_text_file, matching_files
from robust_pretrain.pretraining.pos_mlm.arguments import DataArguments
from robust_pretrain.pretraining.streams import log_stream_sharding
from robust_pretrain.trainer.targets import refuse_tasks_without_targets
from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

logger = logging.getLogger(__name__)

STREAM_SHARE_ROWS = 1000  # sequences of a stream whose words are counted before training


def load_raw_datasets(data_args: DataArguments) -> DatasetDict:
    """UD-EWT text (``ud_dir``) by default, else a Hub dataset or local files; always a train and a validation split."""
    if data_args.dataset_name is not None:
        raw = load_dataset(data_args.dataset_name, data_args.dataset_config_name, streaming=data_args.streaming)
    elif data_args.train_file is not None:
        files = {"train": matching_files(data_args.train_file, "--train_file")}
        if data_args.validation_file is not None:
            files["validation"] = matching_files(data_args.validation_file, "--validation_file")
        builder = TEXT_BUILDERS.get(Path(files["train"][0]).suffix.lstrip("."))
        if builder is None:
            raise UsageError(f"--train_file must be .txt, .json, .jsonl, .csv or .parquet, got {data_args.train_file}")
        for split, paths in files.items():
            for path in paths:
                check_text_file(Path(path), f"--{split}_file", builder)
        try:
            raw = load_dataset(builder, data_files=files, streaming=data_args.streaming)
        except DatasetGenerationError as err:
            cause = err.__cause__ or err
            names = " and ".join(path for paths in files.values() for path in paths)
            raise UsageError(f"could not read {names} as {builder} data: {type(cause).__name__}: {cause}") from err
    else:
        try:
            raw = DatasetDict(
                {
                    split: load_ewt_corpus(source, data_args.ud_dir)
                    for split, source in (("train", "train"), ("validation", "test"))
                }
            )
        except (OSError, ValueError) as err:
            raise UsageError(f"--ud_dir: {err}") from err
    if "validation" not in raw:
        if "test" in raw:
            raw["validation"] = raw["test"]
        elif data_args.streaming:
            raise UsageError(
                "--streaming needs held-out data: pass --validation_file (or a dataset with a validation or test "
                "split); a stream cannot be split by --validation_split_percentage"
            )
        else:
            split = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=0)
            raw = DatasetDict({"train": split["train"], "validation": split["test"]})
    if data_args.streaming:  # the held-out set is read once (whole, or its first --max_eval_samples texts)
        held_out = raw["validation"]
        if data_args.max_eval_samples is not None:
            held_out = held_out.take(data_args.max_eval_samples)
        raw["validation"] = Dataset.from_list(list(held_out))
    for name in ("train", "validation"):
        columns = raw[name].column_names
        if columns is not None and data_args.text_column_name not in columns:
            raise UsageError(
                f"the {name} data has no text column {data_args.text_column_name!r} "
                f"(columns: {raw[name].column_names}); set --text_column_name"
            )
    return raw


def premask(dataset: Dataset, collator: TaskGroupedMLMCollator, max_seq_length: int, pad_id: int) -> Dataset:
    """Apply the masking once (fixed seed) and store the result, so every evaluation scores the same targets."""
    columns: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "task_ids": []}
    fill = {"input_ids": pad_id, "attention_mask": 0, "labels": -100, "task_ids": -100}
    for start in range(0, len(dataset), 256):
        batch = collator([dataset[i] for i in range(start, min(start + 256, len(dataset)))])
        for key, values in columns.items():
            for row in batch[key].tolist():
                values.append(row + [fill[key]] * (max_seq_length - len(row)))
    return Dataset.from_dict(columns)


@dataclass
class PremaskedOrTrainingCollator:
    """Held-out features are already masked (:func:`premask`) and only stacked; training features are masked on the
    fly, with new masks each epoch (``MinimaxTrainer`` calls :meth:`set_epoch`). A streamed batch
    (:func:`~robust_pretrain.data.preprocessing.repeat_stream`) is masked with its first row's stream position as the
    epoch: new masks in every pass over the stream, the same ones in a resumed run."""

    training: TaskGroupedMLMCollator
    _streamed: TaskGroupedMLMCollator | None = field(default=None, init=False, repr=False)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if "labels" in features[0]:
            return default_data_collator(features)
        if STREAM_POSITION_COLUMN in features[0]:
            return self._collate_streamed(features)
        return self.training(features)

    def _collate_streamed(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if self._streamed is None:  # a copy whose epoch (set per batch) is this process's own
            self._streamed = dataclasses.replace(self.training)
        self._streamed.set_epoch(features[0][STREAM_POSITION_COLUMN])
        return self._streamed([{k: v for k, v in row.items() if k != STREAM_POSITION_COLUMN} for row in features])

    @property
    def task_names(self) -> list[str] | None:
        return self.training.task_names

    def sample_tasks(self, schedule: TaskSamplingSchedule, train_dataset: Any, args: Any) -> Any:
        """Training batches draw their tasks by ``schedule`` (:meth:`TaskGroupedMLMCollator.sample_tasks`)."""
        return self.training.sample_tasks(schedule, train_dataset, args)

    def set_epoch(self, epoch: int) -> None:
        self.training.set_epoch(epoch)


def require_targets(dataset: Dataset | IterableDataset, split: str, data_args: DataArguments, spec: TaskSpec) -> None:
    """Refuse data in which the tagger finds no word of any task (training would learn nothing), or implausibly few
    for English text (:data:`~robust_pretrain.data.tasks.IMPLAUSIBLE_SHARE_FRACTION`): text in another language."""
    streamed = isinstance(dataset, IterableDataset)
    task_words, words = task_word_counts(dataset, STREAM_SHARE_ROWS if streamed else None)
    source = data_args.dataset_name or getattr(data_args, f"{split}_file", None) or data_args.train_file
    where = f" ({source})" if source else ""
    expected = spec.expected_share()
    counted = f"in its first {STREAM_SHARE_ROWS} sequences" if streamed else "in it"
    if task_words == 0:
        raise UsageError(
            f"the {split} data{where} contains no word of the tasks {spec.task_names}: none of the {words} words "
            f"{counted} belongs to one (English text has {expected:.1%} of its words in them); the "
            f"`{data_args.tagger}` tagger tags English: is the text in another language, or empty? Nothing could be "
            "masked, so nothing would be learned."
        )
    found = task_words / words
    if expected >= JUDGED_MIN_EXPECTED_SHARE and found < IMPLAUSIBLE_SHARE_FRACTION * expected:
        raise UsageError(
            f"the {split} data{where} does not look like English text: {found:.1%} of the {words} words {counted} "
            f"belong to a task, where English text has {expected:.1%} (at least "
            f"{IMPLAUSIBLE_SHARE_FRACTION * expected:.1%} is accepted); the `{data_args.tagger}` tagger tags English "
            "and gives words of other scripts X, so they would never be masked."
        )
    held_out = "held-out" if split == "validation" else "training"
    counts = words_per_task(dataset, spec.num_tasks, STREAM_SHARE_ROWS if streamed else None)
    reason = f"the `{data_args.tagger}` tagger found no word of its UPOS tags {counted}: nothing could be masked"
    refuse_tasks_without_targets("task", spec.task_names, counts, held_out, reason)


def tag_datasets(
    raw: DatasetDict,
    tokenizer,
    spec: TaskSpec,
    data_args: DataArguments,
    training_args: MinimaxTrainingArguments,
) -> tuple[Dataset | IterableDataset, Dataset]:
    """The training and held-out text tokenized and PoS-tagged (on the main process first), truncated to
    ``--max_train_samples`` / ``--max_eval_samples`` and checked for task words (:func:`require_targets`)."""
    with training_args.main_process_first(desc="tokenizing and PoS-tagging"):
        tagged = {
            name: tokenize_and_tag(
                raw[name],
                tokenizer,
                spec,
                data_args.tagger,
                text_column=data_args.text_column_name,
                max_seq_length=data_args.max_seq_length,
                pack=data_args.pack,
                num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache,
            )
            for name in ("train", "validation")
        }
    train_dataset, eval_dataset = tagged["train"], tagged["validation"]
    if data_args.max_train_samples is not None and data_args.streaming:
        train_dataset = train_dataset.take(data_args.max_train_samples)
    elif data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(data_args.max_train_samples, len(train_dataset))))
    if data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(data_args.max_eval_samples, len(eval_dataset))))
    require_targets(train_dataset, "train", data_args, spec)
    require_targets(eval_dataset, "validation", data_args, spec)
    return train_dataset, eval_dataset


def masking_collator(
    tokenizer, spec: TaskSpec, data_args: DataArguments, training_args: MinimaxTrainingArguments, seed: int
) -> TaskGroupedMLMCollator:
    """The collator that masks task words as ``--masking`` and ``--mlm_probability`` say, drawing from ``seed``."""
    return TaskGroupedMLMCollator(
        tokenizer,
        spec,
        mode=data_args.masking,
        mlm_probability=data_args.mlm_probability,
        pad_to_multiple_of=8 if training_args.fp16 or training_args.bf16 else None,
        seed=seed,
    )


def training_stream(train_dataset: IterableDataset, training_args: MinimaxTrainingArguments) -> IterableDataset:
    """A streamed training set as the trainer reads it: every process reads its own files (Accelerate's default
    would read on process 0 only), over and over (one endless epoch: a resume replays it exactly across passes)."""
    training_args.accelerator_config.dispatch_batches = False
    log_stream_sharding(train_dataset, training_args.world_size, logger)
    return repeat_stream(train_dataset)
