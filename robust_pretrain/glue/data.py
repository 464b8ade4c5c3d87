"""GLUE data from the Hub (``nyu-mll/glue``) or from a local directory in the original GLUE TSV layout.

Both sources yield the same :class:`datasets.DatasetDict`: splits ``train`` plus the task's evaluation splits
(``validation``, or ``validation_matched``/``validation_mismatched`` for MNLI), the Hub's column names and order
(text columns, ``label``, ``idx``) and the Hub's label ids (``ClassLabel`` names, or ``float32`` scores for STS-B).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path

import datasets
from huggingface_hub import constants as hub_constants

from robust_pretrain.cli import UsageError
from robust_pretrain.glue.tasks import GlueTask, get_task

HUB_DATASET = "nyu-mll/glue"

# Some GLUE fields (QQP, MNLI parses) exceed the csv module's default field size limit.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def glue_features(task: str | GlueTask) -> datasets.Features:
    """The Hub's feature schema of one GLUE task."""
    spec = task if isinstance(task, GlueTask) else get_task(task)
    label = datasets.Value("float32") if spec.label_names is None else datasets.ClassLabel(names=list(spec.label_names))
    columns = {name: datasets.Value("string") for name in spec.text_columns}
    return datasets.Features({**columns, "label": label, "idx": datasets.Value("int32")})


def glue_files(task: str | GlueTask, glue_dir: str | Path) -> dict[str, Path]:
    """Split name -> TSV path of one task inside a GLUE directory (existence not checked)."""
    spec = task if isinstance(task, GlueTask) else get_task(task)
    task_dir = Path(glue_dir) / spec.glue_dir_name
    return {"train": task_dir / "train.tsv", **{split: task_dir / name for split, name in spec.eval_files.items()}}


def _open_rows(path: Path) -> Iterator[list[str]]:
    # GLUE TSVs are unquoted (quotes are literal text); MRPC files start with a UTF-8 byte-order mark.
    with path.open(encoding="utf-8-sig", newline="") as handle:
        yield from csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)


def _column_positions(spec: GlueTask, path: Path, header: list[str] | None) -> dict[str, int]:
    if not spec.tsv_header:
        return {column: int(position) for column, position in spec.tsv_columns.items()}
    if header is None:
        raise UsageError(f"GLUE task {spec.name}: {path} is empty (expected a header row)")
    missing = [str(name) for name in spec.tsv_columns.values() if name not in header]
    if missing:
        raise UsageError(
            f"GLUE task {spec.name}: {path} lacks column(s) {missing}; its header is {header}. "
            f"Expected the original GLUE layout for {spec.glue_dir_name}."
        )
    return {column: header.index(str(name)) for column, name in spec.tsv_columns.items()}


def _check_file(spec: GlueTask, path: Path) -> dict[str, int]:
    if not path.is_file():
        raise UsageError(
            f"GLUE task {spec.name}: {path} not found (expected <glue_dir>/{spec.glue_dir_name}/{path.name} "
            "in the original GLUE TSV layout)"
        )
    header = next(_open_rows(path), None) if spec.tsv_header else None
    return _column_positions(spec, path, header)


def check_glue_files(task: str | GlueTask, glue_dir: str | Path) -> None:
    """Fail fast if a task's TSV files are missing or lack the expected columns (reads headers only)."""
    spec = task if isinstance(task, GlueTask) else get_task(task)
    for path in glue_files(spec, glue_dir).values():
        _check_file(spec, path)


def _parse_label(spec: GlueTask, raw: str, where: str) -> int | float:
    if spec.tsv_label_values is None:
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"GLUE task {spec.name}: {where}: score {raw!r} is not a number") from None
    if raw not in spec.tsv_label_values:
        raise UsageError(
            f"GLUE task {spec.name}: {where}: label {raw!r} is not one of {list(spec.tsv_label_values)} "
            f"(labels {list(spec.label_names or ())}); is this the right file for {spec.name}?"
        )
    return spec.tsv_label_values.index(raw)


def read_glue_tsv(task: str | GlueTask, path: str | Path) -> datasets.Dataset:
    """Parse one GLUE TSV file into a Dataset with the Hub's schema (``idx`` = row number, as on the Hub)."""
    spec = task if isinstance(task, GlueTask) else get_task(task)
    path = Path(path)
    positions = _check_file(spec, path)
    needed = max(positions.values()) + 1
    columns: dict[str, list] = {name: [] for name in (*spec.text_columns, "label", "idx")}
    rows = _open_rows(path)
    if spec.tsv_header:
        next(rows)
    first_line = 2 if spec.tsv_header else 1
    for line, row in enumerate(rows, start=first_line):
        if not row:
            continue
        if len(row) < needed:
            raise UsageError(f"GLUE task {spec.name}: {path}:{line} has {len(row)} fields, expected at least {needed}")
        for name in spec.text_columns:
            columns[name].append(row[positions[name]])
        columns["label"].append(_parse_label(spec, row[positions["label"]], f"{path}:{line}"))
        columns["idx"].append(len(columns["idx"]))
    if not columns["idx"]:
        raise UsageError(f"GLUE task {spec.name}: {path} has no examples")
    return datasets.Dataset.from_dict(columns, features=glue_features(spec))


def load_glue(task: str, glue_dir: str | Path | None = None, cache_dir: str | None = None) -> datasets.DatasetDict:
    """Load a task's train and evaluation splits, from ``glue_dir`` if given, else from the Hub."""
    spec = get_task(task)
    if glue_dir is not None:
        return datasets.DatasetDict(
            {split: read_glue_tsv(spec, path) for split, path in glue_files(spec, glue_dir).items()}
        )
    if hub_constants.HF_HUB_OFFLINE:
        raise UsageError(
            f"GLUE task {spec.name}: no --glue_dir given and the Hub is offline (HF_HUB_OFFLINE=1); pass the "
            "directory holding the original GLUE TSV files"
        )
    loaded = datasets.load_dataset(HUB_DATASET, spec.name, cache_dir=cache_dir)
    splits = datasets.DatasetDict({split: loaded[split] for split in ("train", *spec.eval_splits)})
    expected = glue_features(spec)
    for split, dataset in splits.items():
        if dataset.features != expected:
            raise ValueError(f"{HUB_DATASET}/{spec.name} {split}: features {dataset.features} != expected {expected}")
    return splits
