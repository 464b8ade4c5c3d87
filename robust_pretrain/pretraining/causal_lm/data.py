"""The text of the decoder pre-training recipe: each domain's texts from its source (``--domain_files``, a column of
``--dataset_name`` / ``--train_file``, streams, or UD-EWT's genres), split into training and held-out texts, checked
(every domain has text and targets) and packed into sequences within their domain."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset, concatenate_datasets, load_dataset
from datasets.exceptions import DatasetGenerationError

from robust_pretrain.cli import UsageError
from robust_pretrain.data.domains import DOMAIN_COLUMN, EWT_GENRES, domain_texts, ewt_genre_texts, pack_domains
from robust_pretrain.data.text_files import TEXT_BUILDERS, check_text_file, matching_files, subject
from robust_pretrain.pretraining.causal_lm.arguments import DomainDataArguments
from robust_pretrain.reporting.cards import EWT_TRAINING_DATA, TrainingData, hub_dataset, local_files
from robust_pretrain.trainer.targets import refuse_tasks_without_targets
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments


@dataclass
class DomainTexts:
    """The raw texts of a run: ``train`` and ``validation`` with columns ``text`` and ``domain`` (an index into
    ``names``), and where they came from (for the card). Streamed (``streams``: each domain's training texts), ``train``
    holds the first :data:`STREAM_SAMPLE_TEXTS` training texts of each stream, for the checks and the data hashes."""

    names: list[str]
    train: Dataset
    validation: Dataset
    training_data: TrainingData
    streams: list[IterableDataset] | None = None


def parse_domain_files(entries: list[str]) -> dict[str, str]:
    """``name=source`` entries -> ``{name: source}``, names unique and non-empty."""
    sources: dict[str, str] = {}
    for entry in entries:
        name, sep, source = entry.partition("=")
        if not sep or not name or not source:
            raise UsageError(f"--domain_files {entry}: expected name=path (e.g. web=data/web.jsonl)")
        if name in sources:
            raise UsageError(f"--domain_files names the domain {name!r} twice")
        sources[name] = source
    return sources


def _load_source(source: str, option_name: str, text_column: str, streaming: bool = False) -> Dataset | IterableDataset:
    """The train split of a file / glob / dataset folder / Hub dataset (streamed or not), with a text column."""
    if Path(source).is_dir() or not (Path(source).suffix or any(ch in source for ch in "*?[")):
        try:
            raw = load_dataset(source, split="train", streaming=streaming)
        except (OSError, ValueError, DatasetGenerationError) as err:
            raise UsageError(f"{subject(option_name, source)}: could not load it as a dataset ({err})") from err
    else:
        paths = matching_files(source, option_name)
        builder = TEXT_BUILDERS.get(Path(paths[0]).suffix.lstrip("."))
        if builder is None:
            raise UsageError(f"{subject(option_name, source)}: expected a .txt, .json, .jsonl, .csv or .parquet file")
        for path in paths:
            check_text_file(Path(path), option_name, builder)
        try:
            raw = load_dataset(builder, data_files={"train": paths}, split="train", streaming=streaming)
        except DatasetGenerationError as err:
            cause = err.__cause__ or err
            raise UsageError(f"{subject(option_name, source)}: could not read it as {builder} data ({cause})") from err
    if raw.column_names is not None and text_column not in raw.column_names:
        raise UsageError(
            f"{subject(option_name, source)} has no text column {text_column!r} (columns: {raw.column_names}); set "
            "--text_column_name"
        )
    return raw


def _split(dataset: Dataset, percentage: int) -> tuple[Dataset, Dataset]:
    """Each domain's texts split into training and held-out ones (at least one held out per domain, seed 0)."""
    train, held_out = [], []
    for domain in sorted(set(dataset[DOMAIN_COLUMN])):
        texts = domain_texts(dataset, domain)
        if len(texts) < 2:
            train.append(texts)
            continue
        size = max(1, round(len(texts) * percentage / 100))
        parts = texts.train_test_split(test_size=size, seed=0)
        train.append(parts["train"])
        held_out.append(parts["test"])
    return concatenate_datasets(train), concatenate_datasets(held_out) if held_out else dataset.select([])


def _check_domain_column(raw: Dataset, domain_column: str | None, source: str) -> None:
    if domain_column not in raw.column_names:
        raise UsageError(f"--domain_column {domain_column}: {source} has no such column (columns: {raw.column_names})")


def _indexed_domains(raw: Dataset, data_args: DomainDataArguments, names: list[str], source: str) -> Dataset:
    """``raw``'s texts with ``domain`` the index of its ``--domain_column`` value in ``names``; refuse other values."""
    _check_domain_column(raw, data_args.domain_column, source)
    values = [str(value) for value in raw[data_args.domain_column]]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise UsageError(f"--validation_file {source} has domains the training data lacks: {', '.join(unknown)}")
    index = {name: i for i, name in enumerate(names)}
    return Dataset.from_dict({"text": raw[data_args.text_column_name], DOMAIN_COLUMN: [index[v] for v in values]})


def load_domain_texts(data_args: DomainDataArguments) -> DomainTexts:
    """The texts of every domain, from whichever source the options name (UD-EWT genres by default)."""
    column = data_args.text_column_name
    if data_args.streaming:
        return stream_domain_texts(data_args)
    if data_args.domain_files:
        sources = parse_domain_files(data_args.domain_files)
        parts = []
        for index, (name, source) in enumerate(sources.items()):
            raw = _load_source(source, f"--domain_files {name}=", column)
            parts.append(Dataset.from_dict({"text": raw[column], DOMAIN_COLUMN: [index] * len(raw)}))
        train, validation = _split(concatenate_datasets(parts), data_args.validation_split_percentage)
        return DomainTexts(list(sources), train, validation, local_files(*sources.values()))
    if data_args.dataset_name or data_args.train_file:
        option_name = "--dataset_name" if data_args.dataset_name else "--train_file"
        source = data_args.dataset_name or data_args.train_file
        raw = _load_source(source, option_name, column)
        _check_domain_column(raw, data_args.domain_column, source)
        names = sorted({str(value) for value in raw[data_args.domain_column]})
        raw = _indexed_domains(raw, data_args, names, source)
        if data_args.validation_file is None:
            train, validation = _split(raw, data_args.validation_split_percentage)
        else:
            held_out = _load_source(data_args.validation_file, "--validation_file", column)
            train, validation = raw, _indexed_domains(held_out, data_args, names, data_args.validation_file)
        data = hub_dataset(source) if data_args.dataset_name else local_files(source)
        return DomainTexts(names, train, validation, data)
    try:
        train, validation = ewt_genre_texts("train", data_args.ud_dir), ewt_genre_texts("test", data_args.ud_dir)
    except (OSError, ValueError) as err:
        raise UsageError(f"--ud_dir: {err}") from err
    return DomainTexts(list(EWT_GENRES), train, validation, EWT_TRAINING_DATA)


STREAM_SAMPLE_TEXTS = 200
"""Training texts read from each domain's stream before training: checked for data and hashed (the provenance)."""


def stream_domain_texts(data_args: DomainDataArguments) -> DomainTexts:
    """Each ``--domain_files`` source as a stream: its first ``stream_held_out_texts`` texts held out (read now), the
    rest its training stream."""
    sources = parse_domain_files(data_args.domain_files)
    held_out, sample, streams = [], [], []
    for index, (name, source) in enumerate(sources.items()):
        stream = _load_source(source, f"--domain_files {name}=", data_args.text_column_name, streaming=True)
        stream = stream.select_columns([data_args.text_column_name])
        if data_args.text_column_name != "text":
            stream = stream.rename_column(data_args.text_column_name, "text")
        first = [row["text"] for row in stream.take(data_args.stream_held_out_texts)]
        training = stream.skip(data_args.stream_held_out_texts)
        held_out.append(Dataset.from_dict({"text": first, DOMAIN_COLUMN: [index] * len(first)}))
        texts = [row["text"] for row in training.take(STREAM_SAMPLE_TEXTS)]
        sample.append(Dataset.from_dict({"text": texts, DOMAIN_COLUMN: [index] * len(texts)}))
        streams.append(training)
    return DomainTexts(
        list(sources),
        concatenate_datasets(sample),
        concatenate_datasets(held_out),
        local_files(*sources.values()),
        streams=streams,
    )


def texts_per_domain(dataset: Dataset, num_domains: int) -> list[int]:
    """The texts of each domain (by id) in ``dataset``."""
    ids = torch.as_tensor(dataset[DOMAIN_COLUMN], dtype=torch.long)
    return torch.bincount(ids, minlength=num_domains).tolist()


def require_every_domain(texts: DomainTexts) -> list[int]:
    """Texts per domain in the training data; refuse a domain without any training or held-out text."""
    counts = {split: texts_per_domain(dataset, len(texts.names)) for split, dataset in
              (("training", texts.train), ("held-out", texts.validation))}  # fmt: skip
    for split, split_counts in counts.items():
        empty = [name for name, count in zip(texts.names, split_counts, strict=True) if count == 0]
        if empty:
            raise UsageError(
                f"domain {', '.join(empty)} has no {split} text"
                + (" (a domain needs at least 2 texts: one is held out)" if split == "held-out" else "")
            )
    return counts["training"]


def text_tokens(packed: Dataset, tokenizer: Any, num_domains: int) -> list[int]:
    """The tokens of text (not a special token such as the eos ending each text) per domain of packed sequences:
    the domain's targets, blank texts having none."""
    import numpy as np
    import pyarrow.compute as pc

    counts = np.zeros(num_domains, dtype=np.int64)
    for table in packed.select_columns(["input_ids", "task_ids"]).with_format("arrow").iter(batch_size=4096):
        sequences = table.column("input_ids").combine_chunks()
        ids = np.asarray(pc.list_flatten(sequences))
        domains = np.repeat(np.asarray(table.column("task_ids")), np.asarray(pc.list_value_length(sequences)))
        counts += np.bincount(domains[~np.isin(ids, tokenizer.all_special_ids)], minlength=num_domains)
    return counts.tolist()


def pack_sequences(
    texts: DomainTexts, tokenizer: Any, data_args: DomainDataArguments, training_args: MinimaxTrainingArguments
) -> tuple[Dataset, Dataset]:
    """The training and held-out texts packed into ``max_seq_length`` sequences within their domain (the held-out ones
    cut to ``--max_eval_sequences`` per domain); refuse a domain whose texts leave no target in either."""
    num_domains = len(texts.names)
    with training_args.main_process_first(desc="tokenizing and packing"):
        train_sequences = pack_domains(
            texts.train, tokenizer, num_domains, data_args.max_seq_length, num_proc=data_args.preprocessing_num_workers
        )
        eval_sequences = pack_domains(
            texts.validation, tokenizer, num_domains, data_args.max_seq_length,
            num_proc=data_args.preprocessing_num_workers,
        )  # fmt: skip
    for split, packed in (("training", train_sequences), ("held-out", eval_sequences)):
        reason = "no text after tokenisation: its texts are blank or empty"
        refuse_tasks_without_targets("domain", texts.names, text_tokens(packed, tokenizer, num_domains), split, reason)
    if data_args.max_eval_sequences is not None:
        keep = [i for d in range(num_domains) for i in _first_rows(eval_sequences, d, data_args.max_eval_sequences)]
        eval_sequences = eval_sequences.select(keep)
    return train_sequences, eval_sequences


def _first_rows(sequences: Dataset, domain: int, count: int) -> list[int]:
    rows = [i for i, task in enumerate(sequences["task_ids"]) if task == domain]
    return rows[:count]
