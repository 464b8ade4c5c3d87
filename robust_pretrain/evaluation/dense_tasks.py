"""Dense vision as a suite family: semantic segmentation (mIoU), depth (δ1) and classification (top-1), each cell a
:func:`robust_pretrain.vision.finetune.recipe.run_finetune` call. Every primary metric is higher-is-better, x100.

A ``random-init:<checkpoint>`` entry fine-tunes the checkpoint's architecture from random weights (seeded by the
cell's seed; ``finetune_dense --random_init``): the row that says whether pre-training helps at all."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError
from robust_pretrain.evaluation.checkpoints import random_init_source
from robust_pretrain.evaluation.glue_tasks import glue_run_settings
from robust_pretrain.evaluation.tasks import ModelIndexTarget, RunSettings, SuiteTask, TaskFamily, TaskRunResult
from robust_pretrain.reporting.recipe_cards import DENSE_CARD_METRICS, DENSE_TASK_TYPES
from robust_pretrain.vision.finetune.arguments import (
    TASKS,
    DenseDataArguments,
    DenseLoraArguments,
    DenseModelArguments,
    DenseRunArguments,
    DenseTrainingArguments,
)
from robust_pretrain.vision.finetune.data import load_task_data
from robust_pretrain.vision.finetune.metrics import PRIMARY_METRICS, predictions_file_name, text_predictions_file_name
from robust_pretrain.vision.finetune.model import checkpoint_model_type
from robust_pretrain.vision.finetune.recipe import run_finetune

DISPLAY_NAMES = {
    "semseg": ("Segmentation", "mIoU"),
    "depth": ("Depth", "δ1"),
    "classification": ("Classification", "top-1"),
}
# Reported metric keys (without ``eval_``): the fine-tuning card's, except top-5 (absent with fewer than 5 classes).
# Fractions are shown x100, errors (AbsRel, RMSE in metres) as they are.
SUITE_METRICS = {
    task: tuple(key for key in keys if key != "top5_accuracy") for task, keys in DENSE_CARD_METRICS.items()
}
_NOT_SCALED = ("abs_rel", "rmse")


def dense_run_settings(options: Sequence[Any]) -> RunSettings:
    """Settings (fingerprint), limits and fine-tuning method: the GLUE family's rule for the (data, LoRA, training)
    options (every score-changing option is a setting; ``max_*_samples`` and ``max_steps`` are limits) plus the
    model options (inputs, head sizes)."""
    model_args, *rest = options
    settings = glue_run_settings(rest)
    return dataclasses.replace(settings, settings={**settings.settings, "model": dataclasses.asdict(model_args)})


def check_dense_inputs(checkpoints: Sequence[str], tasks: Sequence[SuiteTask], options: Sequence[Any]) -> None:
    """Before any cell: evaluation enabled, every checkpoint an MM-MAE (or, for classification, a ViT), and a folder
    or ``datasets`` source checked image by image for every task (the generated scenes need no check)."""
    model_args, data_args, _, training_args = options
    if not training_args.do_eval:
        raise UsageError("The suite needs evaluation; do not pass --do_eval false")
    for task in tasks:
        model_args.check_task(task.name)
        for checkpoint in checkpoints:
            try:
                checkpoint_model_type(random_init_source(checkpoint) or checkpoint, task.name)
            except UsageError as err:
                raise UsageError(f"--checkpoints: {err}") from None
        if data_args.image_folder is not None or data_args.dataset_name is not None:
            load_task_data(task.name, data_args, model_args.input_modalities, patch_size=None)


def run_dense_task(
    task: str, checkpoint: str, seed: int, output_dir: Path, options: Sequence[Any], save_model: bool
) -> TaskRunResult:
    """Fine-tune ``checkpoint`` on ``task`` with ``seed`` into ``output_dir``; fractions x100."""
    model_args, data_args, lora_args, training_args = options
    source = random_init_source(checkpoint)
    eval_metrics = run_finetune(
        DenseRunArguments(model_name_or_path=source or checkpoint, task=task, random_init=source is not None),
        model_args,
        data_args,
        lora_args,
        dataclasses.replace(training_args, output_dir=str(output_dir), seed=seed),
        save_model=save_model,
    )
    keys = dict.fromkeys((PRIMARY_METRICS[task], *SUITE_METRICS[task]))
    missing = [key for key in keys if f"eval_{key}" not in eval_metrics]
    if missing:
        raise RuntimeError(f"{task}: the evaluation returned no {missing} (got {sorted(eval_metrics)})")
    metrics = {key: eval_metrics[f"eval_{key}"] * (1.0 if key in _NOT_SCALED else 100.0) for key in keys}
    files = [predictions_file_name(task)] + ([text_predictions_file_name(task)] if task == "classification" else [])
    return TaskRunResult(metrics=metrics, prediction_files=tuple(files), raw_metrics=eval_metrics)


def _row(task: str) -> SuiteTask:
    display_name, metric_label = DISPLAY_NAMES[task]
    target = ModelIndexTarget(
        task_type=DENSE_TASK_TYPES[task],
        dataset_type="robust-pretrain-dense",
        dataset_name="dense downstream images (generated scenes' downstream_test, or the suite's --image_folder / "
        "--dataset_name)",
        dataset_split="eval",
    )
    return SuiteTask(
        name=task,
        family="dense",
        display_name=display_name,
        primary_metric=PRIMARY_METRICS[task],
        metric_label=metric_label,
        run=lambda *args, **kwargs: run_dense_task(task, *args, **kwargs),
        card_metrics={key: (key, target) for key in SUITE_METRICS[task]},
    )


FAMILY = TaskFamily(
    name="dense",
    description="Dense vision scores (mIoU, δ1, top-1) x100",
    tasks=tuple(_row(task) for task in TASKS),
    default_tasks=TASKS,
    option_types=(DenseModelArguments, DenseDataArguments, DenseLoraArguments, DenseTrainingArguments),
    run_settings=dense_run_settings,
    check_inputs=check_dense_inputs,
    random_init=True,
)
