"""Machinery shared by the pre-training recipes: resume checks, run config, logging, the final outputs."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import transformers
from transformers.trainer_utils import get_last_checkpoint

from robust_pretrain.hub import HubPublishError, explain_hub_errors, push_or_explain
from robust_pretrain.reporting import TRAJECTORY_PLOT_NAME, plot_task_trajectories, write_task_report
from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.training_args import MinimaxTrainingArguments

logger = logging.getLogger(__name__)

RUN_CONFIG_NAME = "run_config.json"


def setup_logging(training_args: MinimaxTrainingArguments, *loggers: logging.Logger) -> None:
    """INFO logs on the main process (``log_level`` "passive", as in run_mlm.py), warnings on the others."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO,
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    for each in (logger, *loggers):
        each.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)


def last_complete_checkpoint(output_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` with ``trainer_state.json`` (written last): a run killed while saving leaves a
    partial checkpoint, which the Trainer cannot resume from."""
    checkpoints = {}
    for path in Path(output_dir).iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            checkpoints[int(match.group(1))] = path
    for step in sorted(checkpoints, reverse=True):
        if (checkpoints[step] / "trainer_state.json").is_file():
            return str(checkpoints[step])
        logger.warning("skipping %s: incomplete (no trainer_state.json), interrupted while saving", checkpoints[step])
    return None


def check_output_dir(
    output_dir: str | Path, current: dict[str, Any], resume_keys: tuple[str, ...], overwrite: bool
) -> str | None:
    """The checkpoint to resume from, or None; refuses checkpoints of a different run before anything trains."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir() or overwrite:
        return None
    last = get_last_checkpoint(str(output_dir))
    if last is None:
        return None
    saved = output_dir / RUN_CONFIG_NAME
    if not saved.is_file():
        raise ValueError(
            f"{output_dir} holds checkpoints ({Path(last).name}) of a run this recipe did not start; "
            "choose another --output_dir or pass --overwrite_output_dir true"
        )
    previous = json.loads(saved.read_text())
    differing = [k for k in resume_keys if previous.get(k) != current.get(k)]
    if differing:
        details = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in differing)
        raise ValueError(
            f"{output_dir} holds checkpoints of another run ({details}); choose another --output_dir "
            "or pass --overwrite_output_dir true"
        )
    return last_complete_checkpoint(output_dir)


def prepare_output_dir(
    training_args: MinimaxTrainingArguments, current: dict[str, Any], resume_keys: tuple[str, ...], overwrite: bool
) -> str | None:
    """Check ``output_dir`` against this run, delete old checkpoints if ``overwrite``; the checkpoint to resume from."""
    last_checkpoint = check_output_dir(training_args.output_dir, current, resume_keys, overwrite)
    resume_checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    if resume_checkpoint is not None:
        logger.info("Resuming from checkpoint %s (pass --overwrite_output_dir true to start afresh)", resume_checkpoint)
    if overwrite and Path(training_args.output_dir).is_dir() and training_args.should_save:
        for checkpoint in Path(training_args.output_dir).glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    return resume_checkpoint


def write_run_config(training_args: MinimaxTrainingArguments, config: dict[str, Any]) -> None:
    if training_args.should_save:
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / RUN_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def create_trainer(training_args: MinimaxTrainingArguments, **kwargs: Any) -> MinimaxTrainer:
    """A ``MinimaxTrainer``; a Hub failure while it creates the repo (push_to_hub) says that nothing was trained."""
    try:
        with explain_hub_errors(training_args.output_dir, training_args.hub_model_id):
            return MinimaxTrainer(args=training_args, **kwargs)
    except HubPublishError as err:  # its retry hint (publish the saved model) does not apply: nothing is saved yet
        raise HubPublishError(
            f"{str(err).splitlines()[0]}\nThis happened before training started: nothing was trained. Fix the Hub "
            "access and re-run, or re-run with --push_to_hub false and publish the output directory afterwards "
            "with robust-pretrain-publish.",
            reason=err.reason,
            output_dir=err.output_dir,
            repo_id=err.repo_id,
        ) from err


def train_and_evaluate(trainer: MinimaxTrainer, resume_checkpoint: str | None) -> dict[str, float]:
    """Train (resuming if asked), save the model, metrics and state, evaluate; the evaluation metrics."""
    train_result = trainer.train(resume_from_checkpoint=resume_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    eval_metrics = trainer.evaluate()
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    return eval_metrics


def write_report_and_card(
    trainer: MinimaxTrainer, report: dict[str, Any], task_names: list[str], render_card: Callable[[], Any]
) -> None:
    """``task_report.json``, the trajectory plot and the model card (``render_card``, also used by push_to_hub)."""
    if not trainer.args.should_save:
        return
    output_dir = Path(trainer.args.output_dir)
    write_task_report(report, output_dir)
    plot_task_trajectories(task_names, trainer.state.log_history, output_dir / TRAJECTORY_PLOT_NAME)
    trainer.card_renderer = render_card
    trainer.create_model_card()


def push(trainer: MinimaxTrainer) -> None:
    """Push the output directory if ``--push_to_hub``; a Hub failure says how to retry (the local save is complete)."""
    if trainer.args.push_to_hub:
        push_or_explain(
            lambda: trainer.push_to_hub(blocking=True),
            output_dir=trainer.args.output_dir,
            repo_id=trainer.hub_model_id or trainer.args.hub_model_id,
            private=bool(trainer.args.hub_private_repo),
            revision=trainer.args.hub_revision,
        )
