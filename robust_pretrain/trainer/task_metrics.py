"""``task_metrics.jsonl``: the per-task training logs of a run with more tasks than ``max_logged_tasks``."""

from __future__ import annotations

import json
import os
from typing import Any

TASK_METRICS_NAME = "task_metrics.jsonl"  # per-task training logs when T > max_logged_tasks


def merge_task_metrics(history: list[dict[str, Any]], path: str, task_names: list[str]) -> list[dict[str, Any]]:
    """``history`` (a log history) with each step's ``task_loss/<name>`` and ``task_weight/<name>`` from the
    ``task_metrics.jsonl`` at ``path`` merged in by step (steps only the file has are appended, in order)."""
    per_step: dict[int, dict[str, float]] = {}
    with open(path) as stream:
        for line in stream:
            entry = json.loads(line)
            if "step" not in entry:  # the header line of task names
                continue
            values = {f"task_weight/{n}": w for n, w in zip(task_names, entry["task_weight"], strict=True)}
            values.update(
                (f"task_loss/{name}", loss)
                for name, loss in zip(task_names, entry["task_loss"], strict=True)
                if loss is not None
            )
            per_step[entry["step"]] = values
    merged = [{**entry, **per_step.pop(entry["step"], {})} if "step" in entry else entry for entry in history]
    return merged + [{"step": step, **values} for step, values in sorted(per_step.items())]


def truncate_task_metrics(path: str, last_step: int) -> None:
    """Keep the lines of ``task_metrics.jsonl`` up to ``last_step`` (a resumed run's checkpoint step), dropping later
    ones and any torn line, in one atomic replace; a new run (``last_step`` 0) removes the file."""
    if not os.path.isfile(path):
        return
    if last_step <= 0:
        os.remove(path)
        return
    kept = []
    with open(path) as stream:
        for line in stream:
            try:
                entry = json.loads(line)
                if entry.get("step", 0) <= last_step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, AttributeError, TypeError):
                continue
    temporary = f"{path}.tmp"
    with open(temporary, "w") as stream:
        stream.writelines(kept)
    os.replace(temporary, path)
