"""scripts/evidence_tables.py: pooling over pre-training x fine-tuning seeds, deltas and their standard errors."""

from __future__ import annotations

import importlib.util
import math
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "evidence_tables.py"
spec = importlib.util.spec_from_file_location("evidence_tables", SCRIPT)
evidence_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evidence_tables)


def _entry(label: str, scores: dict[str, list[float]]) -> dict:
    means = {task: statistics.fmean(values) for task, values in scores.items()}
    worst = min(means, key=means.__getitem__)
    return {
        "label": label,
        "tasks": {task: {"scores": values, "seeds": [1, 2], "mean": means[task]} for task, values in scores.items()},
        "average": statistics.fmean(means.values()),
        "worst_task": worst,
        "worst_score": means[worst],
    }


def test_pooled_scores_deltas_and_standard_errors() -> None:
    runs = {f"/c/{name}/seed-{seed}": (name, str(seed)) for name in ("base", "new") for seed in (1, 2)}
    suite = {
        "tasks": ["a", "b"],
        "checkpoints": {
            "/c/base/seed-1": _entry("base/seed-1", {"a": [50, 52], "b": [30, 32]}),
            "/c/base/seed-2": _entry("base/seed-2", {"a": [54, 56], "b": [34, 36]}),
            "/c/new/seed-1": _entry("new/seed-1", {"a": [50, 52], "b": [40, 42]}),
            "/c/new/seed-2": _entry("new/seed-2", {"a": [54, 56], "b": [44, 46]}),
            "/m/model": _entry("model", {"a": [60, 60], "b": [20, 20]}),
        },
    }
    tables = evidence_tables.downstream_tables(suite, runs, "base")
    base, new = tables["strategies"]["base"], tables["strategies"]["new"]
    assert base["tasks"]["b"]["mean"] == 33 and base["average"] == 43 and base["worst_task"] == "b"
    assert new["average"] == 48 and new["worst_score"] == 43
    # pooled runs of b: deviations -3, -1, 1, 3 -> sample variance 20 / 3 in both objectives
    standard_error = math.sqrt(2 * (20 / 3) / 4)
    delta = tables["deltas"]["new"]
    assert delta["tasks"] == {"a": 0, "b": 10} and delta["average"] == 5 and delta["worst_score"] == 10
    assert delta["in_standard_errors"]["b"] == pytest.approx(10 / standard_error)
    assert delta["in_standard_errors"]["a"] == 0
    # per run averages of the tasks: base 40, 42, 44, 46; new 45, 47, 49, 51
    assert delta["in_standard_errors"]["average"] == pytest.approx(5 / standard_error)
    assert base["average_over_pretraining_seeds"]["mean"] == 43
    assert base["average_over_pretraining_seeds"]["std"] == pytest.approx(math.sqrt(8))
    assert list(tables["deltas"]) == ["new"]
    assert tables["references"]["model"]["average"] == 40 and tables["references"]["model"]["worst_task"] == "b"
    with pytest.raises(ValueError, match="--baseline 'other' has no checkpoint"):
        evidence_tables.downstream_tables(suite, runs, "other")
