"""What a pre-training run reports: per-task weights and held-out losses (``task_report.json``), read from the Trainer's
own ``log_history``; :func:`write_report_and_card` writes it with the trajectory plot and the model card."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robust_pretrain.reference import TASK_REPORT_NAME, Provenance
from robust_pretrain.reporting.plots import plot_task_trajectories
from robust_pretrain.reporting.scoring import report_reference, score_line, score_losses
from robust_pretrain.reporting.statistics import worst_task

if TYPE_CHECKING:
    from robust_pretrain.trainer import MinimaxTrainer
    from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

TRAJECTORY_PLOT_NAME = "task_weights.png"


def report_settings(
    training_args: MinimaxTrainingArguments, max_steps: int, recipe_settings: dict[str, Any]
) -> dict[str, Any]:
    """The ``settings`` a task report and its card state: the strategy and its options, the recipe's own settings,
    the step budget, learning rate, batch, seed and number of processes."""
    return {
        "weighting": training_args.weighting,
        "settings": {
            "weighting": training_args.weighting,
            **training_args.weighting_options(),
            **recipe_settings,
            "max_steps": max_steps,
            "learning_rate": training_args.learning_rate,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "seed": training_args.seed,
            "processes": training_args.world_size,
        },
    }


def task_report(
    task_names: list[str],
    log_history: list[dict[str, Any]],
    eval_metrics: dict[str, float],
    settings: dict[str, Any],
    final_weights: Sequence[float] | None = None,
    provenance: Provenance | None = None,
) -> dict[str, Any]:
    """Final weight and held-out loss of every task, with the mean and the worst task, and the run's ``scores``
    (``robust_pretrain.reporting.scoring.score_losses``): ``raw``, and ``excess`` over the reference losses the
    run trained against, if any (``reference_losses``); ``provenance`` (``robust_pretrain.reference.Provenance``)
    lets a later run use this one as its ``--reference_run``.

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
    worst = worst_task(eval_losses, higher_is_better=False) if eval_losses else None
    report = {"tasks": task_names, **settings}
    reference = report_reference(report)
    return {
        **report,
        "final_weights": final,
        "eval_task_loss": eval_losses,
        "eval_mean_task_loss": eval_metrics.get("eval_mean_task_loss"),
        "eval_worst_task_loss": eval_metrics.get("eval_worst_task_loss"),
        "worst_task": worst,
        "eval_loss": eval_metrics.get("eval_loss"),
        "train_steps": train_steps,
        "reference_losses": reference,
        "scores": score_losses(eval_losses, reference) if eval_losses else {},
        **({"provenance": provenance.to_dict()} if provenance is not None else {}),
    }


def write_task_report(report: dict[str, Any], output_dir: str | Path) -> Path:
    path = Path(output_dir) / TASK_REPORT_NAME
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def write_report_and_card(trainer: MinimaxTrainer, report: dict[str, Any], render_card: Callable[[], Any]) -> None:
    """``task_report.json``, the trajectory plot and the model card (``render_card``, also used by push_to_hub); the
    console gets the held-out scores in one line (:func:`~robust_pretrain.reporting.scoring.score_line`)."""
    if not trainer.args.should_save:
        return
    if report["scores"]:
        print(f"held-out scores: {score_line(report['scores'])}", flush=True)
    output_dir = Path(trainer.args.output_dir)
    write_task_report(report, output_dir)
    plot_task_trajectories(report["tasks"], trainer.task_log_history(), output_dir / TRAJECTORY_PLOT_NAME)
    trainer.card_renderer = render_card
    trainer.create_model_card()
