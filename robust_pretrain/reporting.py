"""What a pre-training run reports: per-task weights and held-out losses (``task_report.json``) and their trajectories
over training (``task_weights.png``), both read from the Trainer's own ``log_history``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASK_REPORT_NAME = "task_report.json"
TRAJECTORY_PLOT_NAME = "task_weights.png"


def task_report(
    task_names: list[str], log_history: list[dict[str, Any]], eval_metrics: dict[str, float], settings: dict[str, Any]
) -> dict[str, Any]:
    """Final weight and held-out loss of every task, with the mean and the worst task."""
    weights = [entry for entry in log_history if f"task_weight/{task_names[0]}" in entry]
    final_weights = {name: weights[-1][f"task_weight/{name}"] for name in task_names} if weights else {}
    eval_losses = {
        name: eval_metrics[f"eval_task_loss/{name}"] for name in task_names if f"eval_task_loss/{name}" in eval_metrics
    }
    worst = max(eval_losses, key=eval_losses.get) if eval_losses else None
    return {
        "tasks": task_names,
        **settings,
        "final_weights": final_weights,
        "eval_task_loss": eval_losses,
        "eval_mean_task_loss": eval_metrics.get("eval_mean_task_loss"),
        "eval_worst_task_loss": eval_metrics.get("eval_worst_task_loss"),
        "worst_task": worst,
        "eval_loss": eval_metrics.get("eval_loss"),
        "train_steps": max((entry.get("step", 0) for entry in log_history), default=0),
    }


def write_task_report(report: dict[str, Any], output_dir: str | Path) -> Path:
    path = Path(output_dir) / TASK_REPORT_NAME
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def plot_task_trajectories(task_names: list[str], log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """Two panels over optimizer steps: each task's weight and each task's training loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_w, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for i, name in enumerate(task_names):
        for ax, key in ((ax_w, f"task_weight/{name}"), (ax_l, f"task_loss/{name}")):
            points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=name, color=colors(i % 10))
    ax_w.set(title="task weight", xlabel="optimizer step", ylabel="weight")
    ax_l.set(title="task training loss (mean over each logging window)", xlabel="optimizer step", ylabel="loss")
    ax_l.legend(loc="upper right", fontsize=8, ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
