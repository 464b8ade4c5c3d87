"""One aggregation of per-task results, for the suite, the comparison of strategies and the evidence tables.

Per task: mean ± sample standard deviation over seeds. Per checkpoint (or run): the average of the task means and
the worst task, named (the lowest mean where higher is better, the highest loss otherwise; the first such task on a
tie). Against a baseline: deltas of every task, of the average and of the worst score, relative changes, and a
delta's size in standard errors (Welch).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from robust_pretrain.reporting.scoring import upstream_scores
from robust_pretrain.reporting.statistics import mean_std, worst_task


def task_summary(means: Mapping[str, float], higher_is_better: bool) -> dict[str, Any]:
    """``{"average", "worst_task", "worst_score"}`` of per-task means."""
    worst = worst_task(means, higher_is_better)
    return {"average": statistics.fmean(means.values()), "worst_task": worst, "worst_score": means[worst]}


def deltas(entry: Mapping[str, Any], base: Mapping[str, Any], tasks: Sequence[str]) -> dict[str, Any]:
    """``entry`` minus ``base``, each a :func:`task_summary` with every task's :func:`mean_std` under ``"tasks"``: per
    task, the average and the worst score (own worst minus the baseline's worst, whichever tasks those are)."""
    return {
        "tasks": {task: entry["tasks"][task]["mean"] - base["tasks"][task]["mean"] for task in tasks},
        "average": entry["average"] - base["average"],
        "worst_score": entry["worst_score"] - base["worst_score"],
    }


def relative_change(value: float, base: float) -> float:
    """``value / base - 1`` (e.g. -0.05: 5 % below the baseline)."""
    return value / base - 1


def standard_errors(baseline: Sequence[float], other: Sequence[float]) -> float:
    """Difference of means over its standard error (Welch: ``sqrt(s_b^2 / n_b + s_o^2 / n_o)``); inf (signed) for a
    non-zero difference without spread, 0 for no difference."""
    error = (statistics.variance(baseline) / len(baseline) + statistics.variance(other) / len(other)) ** 0.5
    difference = statistics.fmean(other) - statistics.fmean(baseline)
    return difference / error if error else (0.0 if difference == 0 else float("inf") * difference)


def summarize_suite(
    cells: list[dict[str, Any]],
    tasks: Sequence[Any],
    seeds: Sequence[int],
    baseline: str | None,
    description: str = "",
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The suite's summary: per checkpoint the task means/stds over seeds (and every metric's mean), the average, the
    worst task and the deltas against ``baseline``; ``upstream``: the held-out scores of the checkpoints' pre-training
    runs (:func:`~robust_pretrain.reporting.scoring.upstream_scores`; None without any ``task_report.json``).
    ``tasks`` are the suite's :class:`SuiteTask` rows; a checkpoint is labelled by its short label unless two share
    one."""
    from robust_pretrain.evaluation.checkpoints import checkpoint_label, local_dir  # it imports this module

    names = [task.name for task in tasks]
    higher_is_better = tasks[0].higher_is_better
    checkpoints: dict[str, Any] = {}
    for cell in cells:
        entry = checkpoints.setdefault(cell["checkpoint"], {"label": checkpoint_label(cell["checkpoint"]), "tasks": {}})
        task = entry["tasks"].setdefault(cell["task"], {"seeds": [], "scores": [], "metrics": {}})
        task["seeds"].append(cell["seed"])
        task["scores"].append(cell["score"])
        for metric, value in cell["metrics"].items():
            task["metrics"].setdefault(metric, []).append(value)
    for entry in checkpoints.values():
        for task in entry["tasks"].values():
            task.update(mean_std(task["scores"]))
            task["metrics"] = {metric: statistics.fmean(values) for metric, values in task["metrics"].items()}
        entry.update(task_summary({name: entry["tasks"][name]["mean"] for name in names}, higher_is_better))
    labels = [entry["label"] for entry in checkpoints.values()]
    for checkpoint, entry in checkpoints.items():
        if labels.count(entry["label"]) > 1:
            entry["label"] = checkpoint
    if baseline is not None:
        for entry in checkpoints.values():
            entry["delta"] = deltas(entry, checkpoints[baseline], names)
    return {
        "family": tasks[0].family,
        "description": description,
        "tasks": names,
        "columns": {task.name: {"header": task.header, "display_name": task.display_name} for task in tasks},
        "higher_is_better": higher_is_better,
        "seeds": list(seeds),
        "baseline": baseline,
        "limits": dict(limits or {}),
        "checkpoints": checkpoints,
        "upstream": upstream_scores({checkpoint: local_dir(checkpoint) for checkpoint in checkpoints}, baseline),
    }


def restrict_to_common_tasks(
    reports: Mapping[str, list[dict[str, Any]]],
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The runs' task reports scored on the tasks with a held-out loss in every report, and the tasks left out (a task
    with no held-out target in some run, e.g. a small ``max_eval_samples``). A report missing none is returned as is;
    the others get their mean, worst value and worst task recomputed over the common tasks, so every run is scored on
    the same tasks."""
    every = [report for seeds in reports.values() for report in seeds]
    common = [task for task in every[0]["tasks"] if all(task in report["eval_task_loss"] for report in every)]
    left_out = [task for task in every[0]["tasks"] if task not in common]
    if not left_out:
        return dict(reports), []

    def restricted(report: dict[str, Any]) -> dict[str, Any]:
        losses = {task: report["eval_task_loss"][task] for task in common}
        worst = worst_task(losses, higher_is_better=False)
        return {
            **report,
            "tasks": common,
            "eval_task_loss": losses,
            "eval_mean_task_loss": statistics.fmean(losses.values()),
            "eval_worst_task_loss": losses[worst],
            "worst_task": worst,
        }

    return {run: [restricted(report) for report in seeds] for run, seeds in reports.items()}, left_out


def aggregate_runs(reports: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per run of a comparison (its seeds' task reports): per-task held-out loss, mean task loss and worst task loss,
    each as mean and std over seeds, and the tasks that were worst in some seed."""
    table = {}
    for run, seeds in reports.items():
        tasks = seeds[0]["tasks"]
        table[run] = {
            "seeds": len(seeds),
            "task_loss": {t: mean_std([r["eval_task_loss"][t] for r in seeds]) for t in tasks},
            "mean_task_loss": mean_std([r["eval_mean_task_loss"] for r in seeds]),
            "worst_task_loss": mean_std([r["eval_worst_task_loss"] for r in seeds]),
            "worst_tasks": sorted({r["worst_task"] for r in seeds}),
        }
    return table
