"""Scale-free worst-case scoring of per-task held-out losses, the same wherever a result is read.

Three metrics, each with its mean over tasks and its worst task named (the highest value; the first on a tie):

* ``raw`` — the held-out loss ``L_t`` itself. Its worst task tends to be the one with the most irreducible entropy.
* ``excess`` — ``L_t - ref_t`` over a reference's held-out loss on the same task (a reference run's
  ``task_report.json``, or the ``reference_losses`` a run trained against). **Signed**, not clipped: a task on which
  the run beats its reference counts as negative. The trainer's ``excess`` objective clips at 0 (DoReMi) so that a
  task already below its reference gets no more weight than any other; a score must keep that information. Whenever
  some task is above its reference, the worst task and the worst value are the same as with the clipped form
  (``max(x, 0)`` keeps the order of positive values); only the mean differs, and the signed mean is the average gap.
* ``regret`` — ``L_t / L_t(baseline)`` against the comparison's baseline run (1.0 for every task of the baseline
  itself; < 1 is better). Over several seeds, seed ``i`` of a run is divided by seed ``i`` of the baseline (same data
  order and initialisation).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from robust_pretrain.reference import TASK_REPORT_NAME
from robust_pretrain.reporting.statistics import mean_std, worst_task

METRICS = ("raw", "excess", "regret")
METRIC_CAPTIONS = {
    "raw": "raw held-out loss L_t (lower is better)",
    "excess": "excess L_t - ref_t over the reference's held-out loss, signed (lower is better; < 0: below the "
    "reference)",
    "regret": "regret L_t / L_t(baseline) (lower is better; the baseline is 1 on every task)",
}
METRIC_LABELS = {  # axis labels
    "raw": "held-out loss L_t",
    "excess": "excess L_t - ref_t (signed)",
    "regret": "regret L_t / L_t(baseline)",
}


def task_scores(values: Mapping[str, float]) -> dict[str, Any]:
    """``{"tasks", "mean", "worst_task", "worst"}`` of per-task values of one metric (higher is worse)."""
    worst = worst_task(values, higher_is_better=False)
    return {
        "tasks": dict(values),
        "mean": statistics.fmean(values.values()),
        "worst_task": worst,
        "worst": values[worst],
    }


def score_losses(
    losses: Mapping[str, float],
    reference: Mapping[str, float] | None = None,
    baseline: Mapping[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per metric (:data:`METRICS`) the :func:`task_scores` of ``losses``: ``raw`` always, ``excess`` with a
    ``reference`` and ``regret`` with a ``baseline`` (each a loss per task of ``losses``)."""
    scores = {"raw": task_scores(losses)}
    if reference is not None:
        scores["excess"] = task_scores({task: loss - reference[task] for task, loss in losses.items()})
    if baseline is not None:
        scores["regret"] = task_scores({task: loss / baseline[task] for task, loss in losses.items()})
    return scores


def score_line(scores: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: per metric present, its mean and its worst value with the worst task (excess signed)."""
    parts = []
    for metric, entry in scores.items():
        fmt = "{:+.4f}" if metric == "excess" else "{:.4f}"
        mean, worst = fmt.format(entry["mean"]), fmt.format(entry["worst"])
        parts.append(f"{metric} mean {mean}, worst {worst} ({entry['worst_task']})")
    return " | ".join(parts)


def task_mismatch(tasks: Sequence[str], reference_tasks: Sequence[str], what: str) -> str | None:
    """Why ``reference_tasks`` cannot score runs of ``tasks`` (each difference named), or None when they are the
    same tasks."""
    missing = [task for task in tasks if task not in reference_tasks]
    extra = [task for task in reference_tasks if task not in tasks]
    if not missing and not extra:
        return None
    differences = [f"it lacks {missing}" if missing else "", f"it has tasks the runs lack {extra}" if extra else ""]
    return f"{what} does not have the runs' tasks {list(tasks)}: " + "; ".join(d for d in differences if d)


def report_reference(report: Mapping[str, Any]) -> dict[str, float] | None:
    """The reference a run trained against (its ``reference_losses`` setting), per task; None without one."""
    values = report.get("settings", {}).get("reference_losses")
    return None if values is None else dict(zip(report["tasks"], values, strict=True))


def aggregate_scores(
    reports: Mapping[str, Sequence[Mapping[str, Any]]],
    reference: Mapping[str, float] | None,
    baseline: str | None,
) -> dict[str, dict[str, Any]]:
    """Per metric and run of a comparison (each run: its seeds' task reports, seeds in the same order for every run):
    every task's value, the mean and the worst value, each as mean and std over seeds, the tasks that were worst in
    some seed, and each seed's mean, worst value and worst task (``per_seed``). ``excess`` needs ``reference``;
    ``regret`` a ``baseline`` run among ``reports``."""
    per_seed = {
        run: [
            score_losses(
                report["eval_task_loss"],
                reference,
                reports[baseline][seed]["eval_task_loss"] if baseline is not None else None,
            )
            for seed, report in enumerate(seeds)
        ]
        for run, seeds in reports.items()
    }
    metrics = [metric for metric in METRICS if metric in next(iter(per_seed.values()))[0]]
    table: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        table[metric] = {}
        for run, seeds in per_seed.items():
            scored = [seed[metric] for seed in seeds]
            table[metric][run] = {
                "tasks": {task: mean_std([s["tasks"][task] for s in scored]) for task in scored[0]["tasks"]},
                "mean": mean_std([s["mean"] for s in scored]),
                "worst": mean_std([s["worst"] for s in scored]),
                "worst_tasks": sorted({s["worst_task"] for s in scored}),
                "per_seed": [{key: s[key] for key in ("mean", "worst", "worst_task")} for s in scored],
            }
    return table


def upstream_scores(checkpoints: Mapping[str, Path | None], baseline: str | None) -> dict[str, Any] | None:
    """The upstream rows of a downstream suite: the held-out scores of each checkpoint's pre-training run, read from
    the ``task_report.json`` in its directory (``checkpoints``: checkpoint -> its local directory, None for a Hub id).

    Checkpoints with the first report's tasks are scored; ``regret`` against ``baseline`` when it has such a report,
    ``excess`` when every scored run trained against the same ``reference_losses``. None when no checkpoint has a
    report. Returns ``{"tasks", "baseline", "reference_losses", "skipped", "scores"}`` (``scores``: as
    :func:`aggregate_scores`, one seed per checkpoint; ``skipped``: checkpoints whose report has other tasks)."""
    reports = {
        checkpoint: json.loads((directory / TASK_REPORT_NAME).read_text())
        for checkpoint, directory in checkpoints.items()
        if directory is not None and (directory / TASK_REPORT_NAME).is_file()
    }
    if not reports:
        return None
    tasks = next(iter(reports.values()))["tasks"]
    scored = {checkpoint: [report] for checkpoint, report in reports.items() if report["tasks"] == tasks}
    references = [report_reference(report) for (report,) in scored.values()]
    reference = (
        references[0] if references[0] is not None and references.count(references[0]) == len(references) else None
    )
    baseline = baseline if baseline in scored else None
    return {
        "tasks": tasks,
        "baseline": baseline,
        "reference_losses": reference,
        "skipped": [checkpoint for checkpoint in reports if checkpoint not in scored],
        "scores": aggregate_scores(scored, reference, baseline),
    }
