"""Offline ``evaluate`` metric modules for the vision tasks: semantic segmentation, depth, classification."""

from __future__ import annotations

from pathlib import Path

import evaluate

_METRICS_DIR = Path(__file__).resolve().parent
VISION_METRIC_PATHS = {
    "semseg": str(_METRICS_DIR / "semseg_metric"),
    "depth": str(_METRICS_DIR / "depth_metric"),
    "classification": str(_METRICS_DIR / "classification_metric"),
}


def load_vision_metric(name: str) -> evaluate.EvaluationModule:
    """Load the shipped metric module of task ``name`` (semseg, depth or classification) by path, offline."""
    if name not in VISION_METRIC_PATHS:
        raise ValueError(f"unknown vision metric {name!r}; expected one of {sorted(VISION_METRIC_PATHS)}")
    return evaluate.load(VISION_METRIC_PATHS[name])
