"""What :class:`~robust_pretrain.trainer.MinimaxTrainer` logs of its tasks: per-task eval metrics (perplexities for
a causal LM), the per-task training logs or, beyond ``max_logged_tasks``, their summary and ``task_metrics.jsonl``
(:mod:`robust_pretrain.trainer.task_metrics`), and the sampling weights of ``task_sampling``."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import torch
from transformers.integrations import TensorBoardCallback

from .task_metrics import TASK_METRICS_NAME, merge_task_metrics, truncate_task_metrics


class TaskLogs:
    """``MinimaxTrainer``'s logging side, mixed into it: the ``evaluation_loop`` and ``log`` hooks and what they add.

    Reads the trainer's ``task_names``, ``step_weights``, ``task_schedule``, ``weighting``, ``lm_loss`` and its
    running per-task sums (``_train_sums``, ``_eval_sums``), set by ``MinimaxTrainer.__init__``, and sums over
    processes with its ``_all_reduce``.
    """

    def evaluation_loop(
        self,
        dataloader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ):
        """The Trainer's loop, plus per-task losses, their mean and the worst task's loss.

        When predictions are collected (for ``compute_metrics`` or ``predict``) the MLM head computes full-size
        logits, so ``preprocess_logits_for_metrics`` and ``compute_metrics`` see them in the layout of the labels.
        """
        self._eval_sums.zero_()
        loss_only = self.args.prediction_loss_only if prediction_loss_only is None else prediction_loss_only
        self._collecting_predictions = not loss_only
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        finally:
            self._collecting_predictions = False
        output.metrics.update(self.task_metrics(self._all_reduce(self._eval_sums).cpu(), metric_key_prefix))
        return output

    def task_metrics(self, pooled: torch.Tensor, prefix: str) -> dict[str, float]:
        """``{prefix}_task_loss/<name>``, ``{prefix}_mean_task_loss`` and ``{prefix}_worst_task_loss``; for a causal LM
        also ``{prefix}_task_perplexity/<name>`` and ``{prefix}_worst_task_perplexity`` (exp of the mean token loss)."""
        sums, counts = pooled[: self.num_tasks], pooled[self.num_tasks :]
        losses = {name: float(sums[i] / counts[i]) for i, name in enumerate(self.task_names) if counts[i] > 0}
        metrics = {f"{prefix}_task_loss/{name}": value for name, value in losses.items()}
        if losses:
            metrics[f"{prefix}_mean_task_loss"] = sum(losses.values()) / len(losses)
            metrics[f"{prefix}_worst_task_loss"] = max(losses.values())
        if losses and self.causal_lm:
            metrics.update({f"{prefix}_task_perplexity/{name}": perplexity(loss) for name, loss in losses.items()})
            metrics[f"{prefix}_worst_task_perplexity"] = perplexity(max(losses.values()))
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and "eval_loss" not in logs:
            pooled = self._all_reduce(self._train_sums.clone()).cpu()
            self._train_sums.zero_()
            sums, counts = pooled[: self.num_tasks], pooled[self.num_tasks :]
            if self.num_tasks <= self.args.max_logged_tasks:
                logs.update(self._per_task_logs(sums, counts))
            else:
                logs.update(self._task_summary(sums, counts))
                self._write_task_metrics(sums, counts)
            logs.update(self._sampling_logs())
            logs.update(self.weighting.log_values())  # e.g. minimax_alpha
            if self.lm_loss is not None and self.lm_loss.last_chunk_size is not None:
                logs["causal_lm_chunk_size"] = self.lm_loss.last_chunk_size  # the last forward pass's
        super().log(logs, start_time)

    def _per_task_logs(self, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
        """``task_loss/<name>`` (tasks with targets since the last log) and ``task_weight/<name>``, rounded to 6
        digits: one tensor-to-list conversion each, whatever T is."""
        loss_keys = [f"task_loss/{name}" for name in self.task_names]
        weight_keys = [f"task_weight/{name}" for name in self.task_names]
        losses = (sums / counts.clamp_min(1)).tolist()
        logs = {key: round(loss, 6) for key, loss, n in zip(loss_keys, losses, counts.tolist(), strict=True) if n > 0}
        logs.update(zip(weight_keys, (round(w, 6) for w in self.step_weights.tolist()), strict=True))
        return logs

    def _sampling_logs(self) -> dict[str, float]:
        """With ``task_sampling``: the step's sampling weights (normalised), ``task_sampling_weight/<name>``
        (``task_weight/<name>`` are the objective's), or beyond ``max_logged_tasks`` their effective number
        ``exp(H)`` (``task_sampling_weight_effective_number``)."""
        weights = None if self.task_schedule is None else self.task_schedule.weights_at(self.state.global_step)
        if weights is None:
            return {}
        p = weights / weights.sum()
        if self.num_tasks <= self.args.max_logged_tasks:
            keys = (f"task_sampling_weight/{name}" for name in self.task_names)
            return dict(zip(keys, (round(w, 6) for w in p.tolist()), strict=True))
        entropy = float(-(p * p.clamp_min(1e-300).log()).sum())
        return {"task_sampling_weight_effective_number": round(math.exp(entropy), 4)}

    def _task_summary(self, sums: torch.Tensor, counts: torch.Tensor) -> dict[str, Any]:
        """The compact log of a run with more than ``max_logged_tasks`` tasks: ``worst_task`` (name),
        ``worst_task_loss`` and ``mean_task_loss`` over the tasks with targets since the last log, and the entropy
        (nats) and effective number ``exp(entropy)`` of the step's task weights normalised to sum to 1."""
        summary: dict[str, Any] = {}
        measured = counts > 0
        if bool(measured.any()):
            losses = torch.where(measured, sums / counts.clamp_min(1), -math.inf)
            worst = int(losses.argmax())
            summary["worst_task"] = self.task_names[worst]
            summary["worst_task_loss"] = round(float(losses[worst]), 6)
            summary["mean_task_loss"] = round(float(losses[measured].mean()), 6)
        weights = self.step_weights.double().clamp_min(0)
        if float(weights.sum()) > 0:
            p = weights / weights.sum()
            entropy = float(-(p * p.clamp_min(1e-300).log()).sum())
            summary["task_weight_entropy"] = round(entropy, 6)
            summary["task_weight_effective_number"] = round(math.exp(entropy), 4)
        return summary

    def task_log_history(self) -> list[dict[str, Any]]:
        """The log history with every task's ``task_loss/<name>`` and ``task_weight/<name>``: as logged, or, when
        ``T > max_logged_tasks`` kept them out of the logs, merged in from ``task_metrics.jsonl`` by step."""
        path = os.path.join(self.args.output_dir, TASK_METRICS_NAME)
        history = self.state.log_history
        if not os.path.isfile(path) or any(f"task_weight/{self.task_names[0]}" in entry for entry in history):
            return history
        return merge_task_metrics(history, path, self.task_names)

    def _write_task_metrics(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Append ``{"step", "task_loss", "task_weight"}`` to ``task_metrics.jsonl`` in ``output_dir`` (main process
        only), the values in task-id order as the per-task logs would give them (``null``: no targets since the last
        log) after a first line ``{"task_names": [...]}``; and send them to TensorBoard when its callback is active.
        The first write of a ``train()`` call drops the lines after the step it started from, so a resumed run neither
        duplicates nor loses lines."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, TASK_METRICS_NAME)
        if getattr(self, "_task_metrics_state", None) is not self.state:  # first write of this train() call
            self._task_metrics_state = self.state
            truncate_task_metrics(path, getattr(self, "_initial_global_step", 0))
            if not os.path.isfile(path):
                os.makedirs(self.args.output_dir, exist_ok=True)
                with open(path, "w") as stream:
                    stream.write(json.dumps({"task_names": self.task_names}) + "\n")
        step = self.state.global_step
        losses = [
            round(loss, 6) if n > 0 else None
            for loss, n in zip((sums / counts.clamp_min(1)).tolist(), counts.tolist(), strict=True)
        ]
        weights = [round(weight, 6) for weight in self.step_weights.tolist()]
        with open(path, "a") as stream:
            stream.write(json.dumps({"step": step, "task_loss": losses, "task_weight": weights}) + "\n")
        for callback in self.callback_handler.callbacks:
            writer = getattr(callback, "tb_writer", None)
            if writer is not None and isinstance(callback, TensorBoardCallback):
                for name, loss, weight in zip(self.task_names, losses, weights, strict=True):
                    if loss is not None:
                        writer.add_scalar(f"train/task_loss/{name}", loss, step)
                    writer.add_scalar(f"train/task_weight/{name}", weight, step)


def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` where it overflows a float."""
    return math.exp(loss) if loss < math.log(sys.float_info.max) else math.inf
