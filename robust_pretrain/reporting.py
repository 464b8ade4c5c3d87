"""What a pre-training run reports: per-task weights and held-out losses (``task_report.json``) and their trajectories
over training (``task_weights.png``), both read from the Trainer's own ``log_history``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TASK_REPORT_NAME = "task_report.json"
TRAJECTORY_PLOT_NAME = "task_weights.png"


def task_report(
    task_names: list[str],
    log_history: list[dict[str, Any]],
    eval_metrics: dict[str, float],
    settings: dict[str, Any],
    final_weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Final weight and held-out loss of every task, with the mean and the worst task.

    The final weights are those of the last logged step; ``final_weights`` (the weights of the run's last optimizer
    step, ``MinimaxTrainer.step_weights``) replace them when the log history does not reach the last step (the Trainer
    logs every ``logging_steps`` steps only).
    """
    train_steps = max((entry.get("step", 0) for entry in log_history), default=0)
    logged = [entry for entry in log_history if f"task_weight/{task_names[0]}" in entry]
    final = {name: logged[-1][f"task_weight/{name}"] for name in task_names} if logged else {}
    if final_weights is not None and train_steps > (logged[-1]["step"] if logged else 0):
        final = {name: float(weight) for name, weight in zip(task_names, final_weights, strict=True)}
    eval_losses = {
        name: eval_metrics[f"eval_task_loss/{name}"] for name in task_names if f"eval_task_loss/{name}" in eval_metrics
    }
    worst = max(eval_losses, key=eval_losses.get) if eval_losses else None
    return {
        "tasks": task_names,
        **settings,
        "final_weights": final,
        "eval_task_loss": eval_losses,
        "eval_mean_task_loss": eval_metrics.get("eval_mean_task_loss"),
        "eval_worst_task_loss": eval_metrics.get("eval_worst_task_loss"),
        "worst_task": worst,
        "eval_loss": eval_metrics.get("eval_loss"),
        "train_steps": train_steps,
    }


def write_task_report(report: dict[str, Any], output_dir: str | Path) -> Path:
    path = Path(output_dir) / TASK_REPORT_NAME
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def plot_task_trajectories(task_names: list[str], log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """Two panels over optimizer steps, each task's weight and each task's training loss, saved as a PNG."""
    fig = trajectory_figure(task_names, log_history)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return Path(path)


def trajectory_figure(task_names: list[str], log_history: list[dict[str, Any]]) -> Figure:
    """The figure of :func:`plot_task_trajectories`. A panel with no logged values says so instead of staying empty;
    points are marked, so that a single logged step shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_w, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    train_steps = max((entry.get("step", 0) for entry in log_history), default=0)
    for ax, prefix, what in ((ax_w, "task_weight", "task weights"), (ax_l, "task_loss", "task losses")):
        for i, name in enumerate(task_names):
            key = f"{prefix}/{name}"
            points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=name, color=colors(i % 10), marker="o", markersize=3)
        if not ax.lines:
            message = f"nothing to draw: no {what} were logged"
            if not any("loss" in entry for entry in log_history):  # no training step was logged at all
                message += f"\n(the run's {train_steps} steps ended before its first logging step;\n"
                message += "lower logging_steps to see them)"
            ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax_w.set(title="task weight", xlabel="optimizer step", ylabel="weight")
    ax_l.set(title="task training loss (mean over each logging window)", xlabel="optimizer step", ylabel="loss")
    if ax_l.lines:
        ax_l.legend(loc="upper right", fontsize=8, ncol=2)
    return fig
