"""Markdown tables of aggregated per-task results: the evaluation suite's and the comparison of strategies'."""

from __future__ import annotations

from typing import Any

from robust_pretrain.reporting.aggregation import relative_change
from robust_pretrain.reporting.scoring import METRIC_CAPTIONS


def _signed(value: float) -> str:
    return f"{value:+.1f}"


def suite_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables: scores (mean ± std over seeds) with average and worst task, then deltas vs the baseline, then
    the upstream rows (:func:`upstream_markdown`)."""
    tasks, columns = summary["tasks"], summary["columns"]
    worst = "lowest" if summary["higher_is_better"] else "highest"
    lines = [f"{summary['description']}, mean ± std over seeds {summary['seeds']}; worst task = {worst} mean score."]
    if summary["limits"]:
        limits = ", ".join(f"{name}={value}" for name, value in summary["limits"].items())
        lines.append(f"**Limited protocol** (not comparable with full runs): {limits}.")
    lines += [
        "",
        "| checkpoint | " + " | ".join(columns[task]["header"] for task in tasks) + " | average | worst task |",
        "|---" * (len(tasks) + 3) + "|",
    ]
    for entry in summary["checkpoints"].values():
        scores = [f"{entry['tasks'][t]['mean']:.1f} ± {entry['tasks'][t]['std']:.1f}" for t in tasks]
        worst_task = f"{entry['worst_score']:.1f} ({columns[entry['worst_task']]['display_name']})"
        lines.append(f"| {entry['label']} | " + " | ".join(scores) + f" | {entry['average']:.1f} | {worst_task} |")
    if summary["baseline"] is not None:
        base_label = summary["checkpoints"][summary["baseline"]]["label"]
        lines += [
            "",
            f"Deltas against the baseline {base_label} (worst-case delta = own worst score - baseline's worst score):",
            "",
            "| checkpoint | "
            + " | ".join(f"Δ {columns[t]['display_name']}" for t in tasks)
            + " | Δ average | Δ worst |",
            "|---" * (len(tasks) + 3) + "|",
        ]
        for checkpoint, entry in summary["checkpoints"].items():
            if checkpoint == summary["baseline"]:
                continue
            delta = entry["delta"]
            cells = [_signed(delta["tasks"][t]) for t in tasks]
            lines.append(
                f"| {entry['label']} | "
                + " | ".join(cells)
                + f" | {_signed(delta['average'])} | {_signed(delta['worst_score'])} |"
            )
    upstream = upstream_markdown(summary)
    return "\n".join(lines) + "\n" + (f"\n{upstream}" if upstream else "")


def upstream_markdown(summary: dict[str, Any]) -> str:
    """The suite's upstream rows (``summary["upstream"]``): per metric, one table of each checkpoint's held-out
    per-task scores with the mean and the worst task, captioned with the metric; empty without upstream scores."""
    upstream = summary.get("upstream")
    if not upstream:
        return ""
    labels = {checkpoint: entry["label"] for checkpoint, entry in summary["checkpoints"].items()}
    tasks = upstream["tasks"]
    sources = {
        "raw": "",
        "excess": "; reference: the reference_losses every run trained against",
        "regret": f"; baseline: {labels.get(upstream['baseline'])}",
    }
    lines = ["Upstream: held-out scores of each checkpoint's pre-training run (its task_report.json)."]
    if upstream["skipped"]:
        lines.append(f"Not scored (other tasks than {tasks}): {', '.join(labels[c] for c in upstream['skipped'])}.")
    for metric, by_checkpoint in upstream["scores"].items():
        fmt = "{:+.4f}" if metric == "excess" else "{:.4f}"
        lines += [
            "",
            f"Metric: {METRIC_CAPTIONS[metric]}{sources[metric]}.",
            "",
            "| checkpoint | " + " | ".join(tasks) + " | mean | worst task |",
            "|---" * (len(tasks) + 3) + "|",
        ]
        for checkpoint, entry in by_checkpoint.items():
            cells = [fmt.format(entry["tasks"][task]["mean"]) for task in tasks]
            worst = f"{fmt.format(entry['worst']['mean'])} ({entry['worst_tasks'][0]})"
            lines.append(
                f"| {labels[checkpoint]} | " + " | ".join(cells) + f" | {fmt.format(entry['mean']['mean'])} | {worst} |"
            )
    if "excess" not in upstream["scores"]:
        lines += ["", "No excess table: the runs did not all train against the same reference_losses."]
    return "\n".join(lines) + "\n"


def comparison_markdown(table: dict, baseline: str | None) -> str:
    """Markdown table of a comparison of strategies (:func:`~robust_pretrain.reporting.aggregation.aggregate_runs`),
    captioned with its metric: per-task, mean and worst held-out loss per run (mean ± std over seeds), then the
    relative change of the mean and worst task loss against ``baseline``."""
    runs = list(table)
    tasks = list(next(iter(table.values()))["task_loss"])

    def cell(stat: dict) -> str:
        return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if stat["std"] else f"{stat['mean']:.4f}"

    lines = [f"Metric: {METRIC_CAPTIONS['raw']}; mean ± std over seeds.", ""]
    lines += ["| task | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    lines += [f"| {t} | " + " | ".join(cell(table[r]["task_loss"][t]) for r in runs) + " |" for t in tasks]
    lines.append("| **mean** | " + " | ".join(cell(table[r]["mean_task_loss"]) for r in runs) + " |")
    lines.append("| **worst** | " + " | ".join(cell(table[r]["worst_task_loss"]) for r in runs) + " |")
    lines.append("| worst task | " + " | ".join(", ".join(table[r]["worst_tasks"]) for r in runs) + " |")
    if baseline in table:
        base = table[baseline]
        lines += [
            "",
            f"Relative change against `{baseline}` (negative is better):",
            "",
            "| run | mean task loss | worst task loss |",
            "|---|---|---|",
        ]
        for run in runs:
            if run != baseline:
                mean = relative_change(table[run]["mean_task_loss"]["mean"], base["mean_task_loss"]["mean"])
                worst = relative_change(table[run]["worst_task_loss"]["mean"], base["worst_task_loss"]["mean"])
                lines.append(f"| {run} | {mean:+.1%} | {worst:+.1%} |")
    return "\n".join(lines) + "\n"


def scores_markdown(scores: dict[str, dict[str, Any]], baseline: str | None, reference_run: str | None) -> str:
    """One Markdown table per scale-free metric of a comparison besides ``raw`` (which :func:`comparison_markdown`
    shows): excess over ``reference_run``, regret against ``baseline``
    (:func:`~robust_pretrain.reporting.scoring.aggregate_scores`); each captioned with its metric, and a line saying
    why excess is absent when no reference is known."""
    sources = {
        "regret": f"baseline run: `{baseline}` (--baseline; default: proportional when run, else the first run)",
        "excess": f"reference run: `{reference_run}`",
    }
    formats = {"regret": "{:.4f}", "excess": "{:+.4f}"}
    sections = []
    for metric in ("excess", "regret"):
        if metric not in scores:
            continue
        by_run, fmt = scores[metric], formats[metric]
        runs = list(by_run)
        tasks = list(by_run[runs[0]]["tasks"])

        def cell(stat: dict, fmt: str = fmt) -> str:
            value = fmt.format(stat["mean"])
            return f"{value} ± {stat['std']:.4f}" if stat["std"] else value

        lines = [f"Metric: {METRIC_CAPTIONS[metric]}; {sources[metric]}; mean ± std over seeds.", ""]
        lines += ["| task | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
        lines += [f"| {t} | " + " | ".join(cell(by_run[r]["tasks"][t]) for r in runs) + " |" for t in tasks]
        lines.append("| **mean** | " + " | ".join(cell(by_run[r]["mean"]) for r in runs) + " |")
        lines.append("| **worst** | " + " | ".join(cell(by_run[r]["worst"]) for r in runs) + " |")
        lines.append("| worst task | " + " | ".join(", ".join(by_run[r]["worst_tasks"]) for r in runs) + " |")
        sections.append("\n".join(lines) + "\n")
    if "excess" not in scores:
        sections.append("No excess table: no reference run is known (--reference_run).\n")
    return "\n".join(sections)
