"""Machinery shared by the pre-training recipes: run settings, logging, the trainer, the final outputs (the output
directory policy: :mod:`robust_pretrain.output_dir`)."""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import datasets
import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from robust_pretrain.cli import UsageError
from robust_pretrain.hub import HubPublishError, explain_hub_errors, push_or_explain
from robust_pretrain.output_dir import (
    disk_full_is_one_line,
    last_complete_checkpoint,  # noqa: F401  (imported from here by the tests)
)
from robust_pretrain.reporting.scoring import score_losses
from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.weighting import WEIGHTINGS, accepted_options

logger = logging.getLogger(__name__)


def setup_logging(training_args: MinimaxTrainingArguments, *loggers: logging.Logger) -> None:
    """INFO logs on the main process (``log_level`` "passive", as in run_mlm.py), warnings on the others. ``datasets``
    says only its warnings, without progress bars: its caching chatter and bars on stderr would bury a refusal of the
    data (one line) under some twenty lines. ``transformers`` too says only its warnings until :func:`create_trainer`
    has built the trainer (the checks before, which may load a tokenizer or build a model, stay quiet)."""
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
    datasets.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity(max(log_level, logging.WARNING))
    training_args.__dict__["_transformers_log_level"] = log_level  # restored by create_trainer


def bind_tasks(training_args: MinimaxTrainingArguments, task_names: list[str], source: str) -> None:
    """The checks that need the tasks, at once (before any data is tokenised): ``task_names`` that differ from the
    data's (``source``, e.g. "the task spec's") and strategy options of another length are a :class:`UsageError`.
    The trainer takes the same tasks from the data collator."""
    if training_args.task_names and list(training_args.task_names) != list(task_names):
        raise UsageError(f"--task_names {training_args.task_names} differ from {source} {list(task_names)}")
    try:
        training_args.bind_tasks(task_names)
    except ValueError as err:
        raise UsageError(f"invalid options: {err}") from err


def refuse_given_options(argv: list[str], names: list[str], why: str) -> None:
    """Refuse, naming them, the options of ``names`` typed on the command line ``argv`` (a ``--config`` file may
    hold them for other runs), since ``why`` they mean nothing in this run."""
    given = [f"--{name}" for name in names if any(t == f"--{name}" or t.startswith(f"--{name}=") for t in argv)]
    if given:
        raise UsageError(f"{', '.join(given)}: {why}")


# TrainingArguments fields that change what a run computes (MinimaxTrainingArguments' own fields are added).
TRAINING_SETTINGS = (
    "seed",
    "data_seed",
    "full_determinism",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "optim_args",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "fp16",
    "bf16",
    "tf32",
    "label_smoothing_factor",
    "dataloader_drop_last",
    "torch_compile",
    "use_cpu",
)


def training_settings(training_args: MinimaxTrainingArguments) -> dict[str, Any]:
    """Every training setting that changes the result: optimiser, schedule, budget, batch, precision, processes,
    seed, tasks, strategy and the strategy's own options."""
    values = training_args.to_dict()
    settings = {name: values[name] for name in TRAINING_SETTINGS if name in values}
    skip = {f.name for f in fields(TrainingArguments)}.union(*(accepted_options(name) for name in WEIGHTINGS))
    for own in fields(MinimaxTrainingArguments):
        if own.name not in skip:
            settings[own.name] = values[own.name]
    settings.update(training_args.weighting_options(), processes=training_args.world_size)
    return settings


def file_fingerprint(path: str | Path | None) -> str | None:
    """SHA-256 of a local file (the data a run used, not just its name); None for no file or a directory."""
    if path is None or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def summarise_log(logs: dict[str, Any], max_steps: int, reference: dict[str, float] | None = None) -> str:
    """One console line for a Trainer log: loss, learning rate, grad norm and the worst task (its loss and weight, the
    sampling weight when tasks are drawn); an evaluation adds its mean and worst task loss with the worst task named.
    With ``reference`` (the reference loss per task the run trains against) the worst task by excess over it follows,
    with its signed excess (:mod:`robust_pretrain.reporting.scoring`). The per-task values themselves go to
    ``trainer_state.json`` and the configured loggers (``--report_to``)."""
    task_losses = {k.split("/", 1)[1]: v for k, v in logs.items() if k.startswith("task_loss/")}
    eval_losses = {k.split("/", 1)[1]: v for k, v in logs.items() if k.startswith("eval_task_loss/")}
    parts = [f"step {logs['step']}/{max_steps}"] if "step" in logs else []
    formats = {"loss": "loss {:.4f}", "learning_rate": "lr {:.2e}", "grad_norm": "grad norm {:.3f}"}
    parts += [fmt.format(logs[key]) for key, fmt in formats.items() if isinstance(logs.get(key), (int, float))]
    if task_losses:
        worst = max(task_losses, key=task_losses.get)
        weight, sampling = logs.get(f"task_weight/{worst}"), logs.get(f"task_sampling_weight/{worst}")
        if sampling is not None:  # tasks drawn by weight: the objective's weight is the task's share of the batch
            weight_part = f" (sampling weight {sampling:.3f})"
        else:
            weight_part = f" (weight {weight:.3f})" if weight else ""
        parts.append(f"worst task {worst} {task_losses[worst]:.4f}{weight_part}")
        parts += _excess_part(task_losses, reference, "")
    elif "worst_task" in logs:  # more tasks than --max_logged_tasks: the trainer logged a summary
        parts.append(f"worst task {logs['worst_task']} {logs['worst_task_loss']:.4f}")
        parts.append(f"mean task loss {logs['mean_task_loss']:.4f}")
        if "task_weight_effective_number" in logs:
            parts.append(f"weights' effective number {logs['task_weight_effective_number']:.1f}")
    if "eval_mean_task_loss" in logs:
        parts.append(f"eval mean task loss {logs['eval_mean_task_loss']:.4f}")
        worst = f" ({max(eval_losses, key=eval_losses.get)})" if eval_losses else ""
        parts.append(f"worst {logs.get('eval_worst_task_loss', float('nan')):.4f}{worst}")
        parts += _excess_part(eval_losses, reference, "eval ")
    if not parts:  # e.g. the end-of-training summary: its scalar entries
        parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items() if "/" not in k]
    return " | ".join(parts)


def _excess_part(losses: dict[str, float], reference: dict[str, float] | None, prefix: str) -> list[str]:
    """``["<prefix>excess mean m, worst w (task)"]`` of ``losses`` over ``reference``; nothing without either."""
    scored = {task: loss for task, loss in losses.items() if reference is not None and task in reference}
    if not scored:
        return []
    excess = score_losses(scored, reference)["excess"]
    return [f"{prefix}excess mean {excess['mean']:+.4f}, worst {excess['worst']:+.4f} ({excess['worst_task']})"]


def reference_of(args: MinimaxTrainingArguments) -> dict[str, float] | None:
    """The reference loss per task the run's strategy trains against (``reference_losses``, as in its task report),
    or None."""
    reference = args.weighting_options().get("reference_losses")
    return None if reference is None else dict(zip(args.task_names, reference, strict=True))


class CompactProgressCallback(ProgressCallback):
    """The Trainer's progress bar, writing one :func:`summarise_log` line per log instead of the whole dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            line = summarise_log({**(logs or {}), "step": state.global_step}, state.max_steps, reference_of(args))
            self.training_bar.write(line)


class CompactPrinterCallback(PrinterCallback):
    """The Trainer's printer (``--disable_tqdm true``), one :func:`summarise_log` line per log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero:
            line = summarise_log({**(logs or {}), "step": state.global_step}, state.max_steps, reference_of(args))
            print(line, flush=True)


def named_tokenizer(
    tokenizer_name: str | None, model_name_or_path: str | None, checkpoint: str | None
) -> tuple[PreTrainedTokenizerBase, str] | None:
    """The tokenizer named by ``--tokenizer_name``, else ``--model_name_or_path``, else (resuming a from-scratch run)
    the checkpoint's own, its vocabulary kept; with "option name" for messages. None where none is named."""
    name = tokenizer_name or model_name_or_path
    if name is None and checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
        name = checkpoint
    if name is None:
        return None
    source = f"{'--tokenizer_name' if tokenizer_name else '--model_name_or_path'} {name}"
    try:
        return AutoTokenizer.from_pretrained(name), source
    except (OSError, ValueError) as err:
        raise UsageError(f"{source}: no tokenizer could be loaded from it ({err})") from err


def train_tokenizer_once(
    training_args: MinimaxTrainingArguments, desc: str, train: Callable[[], PreTrainedTokenizerBase]
) -> PreTrainedTokenizerBase:
    """One process trains the tokenizer (``train``), the others load its copy (the same, without training it twice)."""
    with training_args.main_process_first(local=False, desc=desc):
        if training_args.process_index == 0:
            tokenizer = train()
            if training_args.world_size > 1:
                tokenizer.save_pretrained(training_args.output_dir)
        else:
            tokenizer = AutoTokenizer.from_pretrained(training_args.output_dir)
    return tokenizer


def create_trainer(training_args: MinimaxTrainingArguments, **kwargs: Any) -> MinimaxTrainer:
    """A ``MinimaxTrainer`` printing compact log lines; a Hub failure while it creates the repo (push_to_hub) says that
    nothing was trained."""
    try:
        with explain_hub_errors(training_args.output_dir, training_args.hub_model_id):
            trainer = MinimaxTrainer(args=training_args, **kwargs)

    except HubPublishError as err:  # its retry hint (publish the saved model) does not apply: nothing is saved yet
        raise HubPublishError(
            f"{str(err).splitlines()[0]}\nThis happened before training started: nothing was trained. Fix the Hub "
            "access and re-run, or re-run with --push_to_hub false and publish the output directory afterwards "
            "with robust-pretrain-publish.",
            reason=err.reason,
            output_dir=err.output_dir,
            repo_id=err.repo_id,
        ) from err
    for verbose, compact in ((ProgressCallback, CompactProgressCallback), (PrinterCallback, CompactPrinterCallback)):
        if trainer.pop_callback(verbose) is not None:
            trainer.add_callback(compact)
    if "_transformers_log_level" in vars(training_args):  # the checks are done: transformers logs as set up
        transformers.utils.logging.set_verbosity(vars(training_args)["_transformers_log_level"])
    return trainer


def train_and_evaluate(trainer: MinimaxTrainer, resume_checkpoint: str | None) -> dict[str, float]:
    """Train (resuming if asked), save the model, metrics and state, evaluate; the evaluation metrics. A full disk
    while saving is one line (:func:`~robust_pretrain.output_dir.disk_full_is_one_line`)."""
    with disk_full_is_one_line(trainer.args.output_dir):
        train_result = trainer.train(resume_from_checkpoint=resume_checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_metrics("train", train_result.metrics)
        trainer.save_state()
    eval_metrics = trainer.evaluate()
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    return eval_metrics


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
