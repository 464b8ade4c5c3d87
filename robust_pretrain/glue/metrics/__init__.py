"""Offline ``evaluate`` metric modules shipped with robust-pretrain."""

from __future__ import annotations

from pathlib import Path

import evaluate

from robust_pretrain.glue.tasks import get_task

GLUE_METRIC_PATH = str(Path(__file__).resolve().parent / "glue_metric")


def load_glue_metric(task: str) -> evaluate.EvaluationModule:
    """Load the shipped GLUE metric module for ``task`` by path (never touches the Hub)."""
    return evaluate.load(GLUE_METRIC_PATH, get_task(task).name)
