"""GLUE fine-tuning and worst-case evaluation of pre-trained checkpoints."""

from robust_pretrain.glue.data import check_glue_files, glue_features, load_glue, read_glue_tsv
from robust_pretrain.glue.finetune import (
    GlueDataArguments,
    GlueRunArguments,
    GlueTrainingArguments,
    LoraArguments,
    run_finetune,
)
from robust_pretrain.glue.metrics import GLUE_METRIC_PATH, load_glue_metric
from robust_pretrain.glue.suite import GlueSuiteArguments, render_markdown, run_suite, summarize, update_model_card
from robust_pretrain.glue.tasks import GLUE_TASKS, TaskSpec, get_task, primary_score

__all__ = [
    "GLUE_METRIC_PATH",
    "GLUE_TASKS",
    "GlueDataArguments",
    "GlueRunArguments",
    "GlueSuiteArguments",
    "GlueTrainingArguments",
    "LoraArguments",
    "TaskSpec",
    "check_glue_files",
    "get_task",
    "glue_features",
    "load_glue",
    "load_glue_metric",
    "primary_score",
    "read_glue_tsv",
    "render_markdown",
    "run_finetune",
    "run_suite",
    "summarize",
    "update_model_card",
]
