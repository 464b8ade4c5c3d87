"""GLUE as a suite family: one row per GLUE task, each cell a :func:`robust_pretrain.glue.run_finetune` call."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError, check_checkpoint
from robust_pretrain.evaluation.tasks import ModelIndexTarget, RunSettings, SuiteTask, TaskFamily, TaskRunResult
from robust_pretrain.glue.data import HUB_DATASET, check_glue_files
from robust_pretrain.glue.finetune import (
    GlueDataArguments,
    GlueRunArguments,
    GlueTrainingArguments,
    LoraArguments,
    predictions_file_name,
    run_finetune,
)
from robust_pretrain.glue.tasks import GLUE_TASKS, GlueTask, primary_score

# The eight GLUE tasks of the usual average (WNLI is excluded, as in BERT).
DEFAULT_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
# TrainingArguments that cannot change a score (bookkeeping, logging, saving, the Hub; seed and output_dir are set
# per cell); every other training argument is part of a cell's settings.
_BOOKKEEPING = (
    "output_dir", "seed", "local_rank", "logging_*", "log_level*", "log_on_each_node", "report_to", "run_name",
    "project", "trackio_*", "disable_tqdm", "save_*", "push_to_hub", "hub_*", "resume_from_checkpoint",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "skip_memory_metrics", "include_num_input_tokens_seen", "enable_jit_checkpoint",
)  # fmt: skip
# Options that cut the paper's protocol short (recorded with every result); max_steps only when positive.
_DATA_LIMITS = ("max_train_samples", "max_eval_samples")


def _split_suffix(split: str) -> str:
    return "_mm" if split == "validation_mismatched" else ""


def glue_run_settings(options: Sequence[Any]) -> RunSettings:
    """Settings (fingerprint), limits and fine-tuning method of parsed GLUE options (the data source is not a
    setting: the Hub and the TSV files give the same examples)."""
    data_args, lora_args, training_args = options
    training = {
        name: value
        for name, value in training_args.to_dict().items()
        if not any(fnmatch.fnmatch(name, pattern) for pattern in _BOOKKEEPING)
    }
    data = {
        name: value for name, value in dataclasses.asdict(data_args).items() if name not in ("glue_dir", "cache_dir")
    }
    limits = {name: getattr(data_args, name) for name in _DATA_LIMITS if getattr(data_args, name) is not None}
    if training_args.max_steps > 0:
        limits["max_steps"] = training_args.max_steps
    return RunSettings(
        settings={
            "data": data,
            "lora": dataclasses.asdict(lora_args) if lora_args.use_lora else None,
            "training": training,
        },
        limits=limits,
        fine_tuning="lora" if lora_args.use_lora else "full",
    )


def check_glue_inputs(checkpoints: Sequence[str], tasks: Sequence[SuiteTask], options: Sequence[Any]) -> None:
    """Missing checkpoints, missing TSV files or columns, or disabled evaluation fail before any cell runs."""
    data_args, _, training_args = options
    if not training_args.do_eval:
        raise UsageError("The suite needs evaluation; do not pass --do_eval false")
    for checkpoint in checkpoints:
        check_checkpoint(checkpoint, "--checkpoints")
    if data_args.glue_dir is not None:
        for task in tasks:
            check_glue_files(task.name, data_args.glue_dir)


def run_glue_task(
    task: str, checkpoint: str, seed: int, output_dir: Path, options: Sequence[Any], save_model: bool
) -> TaskRunResult:
    """Fine-tune ``checkpoint`` on GLUE ``task`` with ``seed`` into ``output_dir``; scores x100."""
    data_args, lora_args, training_args = options
    spec = GLUE_TASKS[task]
    eval_metrics = run_finetune(
        GlueRunArguments(model_name_or_path=checkpoint, task_name=task),
        data_args,
        lora_args,
        dataclasses.replace(training_args, output_dir=str(output_dir), seed=seed),
        save_model=save_model,
    )
    metrics = {spec.primary_metric: primary_score(spec, eval_metrics)}  # a clear error if the metric is missing
    metrics.update({key: 100.0 * eval_metrics[f"eval_{key}"] for key in _card_metrics(spec)})
    return TaskRunResult(
        metrics=metrics,
        prediction_files=tuple(predictions_file_name(task, split) for split in spec.eval_splits),
        raw_metrics=eval_metrics,
    )


def _card_metrics(spec: GlueTask) -> dict[str, tuple[str, ModelIndexTarget]]:
    """Every metric of every eval split (MNLI mismatched keys end in ``_mm``) with its model-index target."""
    return {
        f"{metric}{_split_suffix(split)}": (
            metric,
            ModelIndexTarget(
                task_type="text-classification",
                dataset_type=HUB_DATASET,
                dataset_name=f"GLUE {spec.glue_dir_name}",
                dataset_config=spec.name,
                dataset_split=split,
            ),
        )
        for split in spec.eval_splits
        for metric in spec.metrics
    }


def _row(spec: GlueTask) -> SuiteTask:
    return SuiteTask(
        name=spec.name,
        family="glue",
        display_name=spec.glue_dir_name,
        primary_metric=spec.primary_metric,
        metric_label="mcc" if spec.primary_metric == "matthews_correlation" else None,
        run=lambda *args, **kwargs: run_glue_task(spec.name, *args, **kwargs),
        card_metrics=_card_metrics(spec),
    )


FAMILY = TaskFamily(
    name="glue",
    description="GLUE dev scores x100",
    tasks=tuple(_row(spec) for spec in GLUE_TASKS.values()),
    default_tasks=DEFAULT_TASKS,
    option_types=(GlueDataArguments, LoraArguments, GlueTrainingArguments),
    run_settings=glue_run_settings,
    check_inputs=check_glue_inputs,
)
