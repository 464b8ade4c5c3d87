"""GLUE: task table, data, fine-tuning and metrics (the suite over tasks lives in ``robust_pretrain.evaluation``)."""

from robust_pretrain.glue.data import check_glue_files, glue_features, load_glue, read_glue_tsv
from robust_pretrain.glue.finetune import (
    GlueDataArguments,
    GlueRunArguments,
    GlueTrainingArguments,
    LoraArguments,
    predictions_file_name,
    read_predictions,
    run_finetune,
)
from robust_pretrain.glue.metrics import GLUE_METRIC_PATH, load_glue_metric
from robust_pretrain.glue.tasks import GLUE_TASKS, GlueTask, get_task, primary_score

__all__ = [
    "GLUE_METRIC_PATH",
    "GLUE_TASKS",
    "GlueDataArguments",
    "GlueRunArguments",
    "GlueTask",
    "GlueTrainingArguments",
    "LoraArguments",
    "check_glue_files",
    "get_task",
    "glue_features",
    "load_glue",
    "load_glue_metric",
    "predictions_file_name",
    "primary_score",
    "read_predictions",
    "read_glue_tsv",
    "run_finetune",
]
