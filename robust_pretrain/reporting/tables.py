"""Markdown tables of aggregated per-task results: the evaluation suite's and the comparison of strategies'."""

from __future__ import annotations

from typing import Any

from robust_pretrain.reporting.aggregation import relative_change


def _signed(value: float) -> str:
    return f"{value:+.1f}"


def suite_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables: scores (mean ± std over seeds) with average and worst task, then deltas vs the baseline."""
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
    return "\n".join(lines) + "\n"


def comparison_markdown(table: dict, baseline: str | None) -> str:
    """Markdown table of a comparison of strategies (:func:`~robust_pretrain.reporting.aggregation.aggregate_runs`):
    per-task, mean and worst held-out loss per run (mean ± std over seeds), then the relative change of the mean and
    worst task loss against ``baseline``."""
    runs = list(table)
    tasks = list(next(iter(table.values()))["task_loss"])

    def cell(stat: dict) -> str:
        return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if stat["std"] else f"{stat['mean']:.4f}"

    lines = ["| task | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
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
