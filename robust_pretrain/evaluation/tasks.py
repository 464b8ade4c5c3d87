"""The suite's task table: each downstream task is a row (:class:`SuiteTask`) of a family (:class:`TaskFamily`).

A family groups tasks that share command-line options (GLUE: data, LoRA and training arguments) and are compared
with each other (average, worst task). Families are listed in :data:`FAMILY_MODULES` by module path and imported
only when selected, so ``--family glue`` never imports the vision code; tests and plug-ins may add a family at run
time with :func:`register_family`.

Adding a family (e.g. dense vision tasks): write ``robust_pretrain/evaluation/<family>_tasks.py`` defining
``FAMILY = TaskFamily(...)`` from the fine-tuning code in ``robust_pretrain/<area>/`` and add one line to
:data:`FAMILY_MODULES`; the suite's logic is unchanged.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError

# family name -> module defining ``FAMILY``.
FAMILY_MODULES: dict[str, str] = {
    "glue": "robust_pretrain.evaluation.glue_tasks",
    "dense": "robust_pretrain.evaluation.dense_tasks",
    "probe": "robust_pretrain.evaluation.probe_tasks",
}
_REGISTERED: dict[str, TaskFamily] = {}


@dataclass(frozen=True)
class TaskRunResult:
    """What one fine-tune-and-evaluate run returns.

    ``metrics``: metric name -> value on the scale shown in tables and cards (e.g. 0-100); must contain the task's
    ``primary_metric`` and every key of its ``card_metrics``. ``prediction_files``: per-example prediction files
    (paths relative to the run's output directory) a user can recompute the metrics from. ``raw_metrics``: the
    underlying results as logged (kept in the cell file for reference).
    """

    metrics: dict[str, float]
    prediction_files: tuple[str, ...] = ()
    raw_metrics: dict[str, Any] = field(default_factory=dict)


class TaskRunner(typing.Protocol):
    """Signature of ``SuiteTask.run``."""

    def __call__(
        self, checkpoint: str, seed: int, output_dir: Path, options: Sequence[Any], save_model: bool
    ) -> TaskRunResult:
        """Fine-tune ``checkpoint`` with ``seed`` (every random choice derived from it), evaluate, write the
        run's files (including the prediction files) into the existing, empty ``output_dir``, keep the fine-tuned
        model there only if ``save_model``. ``options`` are the family's parsed option dataclasses, in the order of
        :attr:`TaskFamily.option_types`; ``output_dir`` and ``seed`` override any such field in them."""


@dataclass(frozen=True)
class ModelIndexTarget:
    """Where a metric goes in a card's ``model-index`` (Hub metadata): task type, dataset and split."""

    task_type: str
    dataset_type: str
    dataset_name: str
    dataset_split: str
    dataset_config: str | None = None


@dataclass(frozen=True)
class SuiteTask:
    """One row of the task table.

    ``name`` is what ``--tasks`` accepts (case-insensitive, ``-`` ignored); ``display_name`` heads table columns.
    ``primary_metric`` is the key of ``TaskRunResult.metrics`` the suite compares (mean over seeds, average
    over tasks, worst task), ``higher_is_better`` its direction (every task of one suite run must share it).
    ``card_metrics`` maps each reported metric key to its ``model-index`` metric type and target.
    """

    name: str
    family: str
    display_name: str
    primary_metric: str
    run: TaskRunner
    card_metrics: dict[str, tuple[str, ModelIndexTarget]]
    higher_is_better: bool = True
    metric_label: str | None = None  # short label of the primary metric in table headers (default: its name)

    @property
    def header(self) -> str:
        return f"{self.display_name} ({self.metric_label or self.primary_metric})"


@dataclass(frozen=True)
class RunSettings:
    """The options of one suite run, as the suite needs them.

    ``settings``: every setting that can change a score (JSON-serialisable); a finished cell is reused only when
    these (and checkpoint, task and seed) are unchanged. ``limits``: cuts of the full protocol (``max_steps``,
    ``max_train_samples``, ``max_eval_samples``, ...), empty for a full-protocol run; recorded with every result
    and in every card entry. ``fine_tuning``: how the weights are adapted (``full``, ``lora``), shown in cards.
    """

    settings: dict[str, Any]
    limits: dict[str, Any]
    fine_tuning: str = "full"


@dataclass(frozen=True)
class TaskFamily:
    """Tasks sharing options and compared with each other.

    ``option_types``: dataclasses parsed (with ``HfArgumentParser``) next to the suite's own arguments; exactly one
    of them has an ``output_dir`` field, the suite directory. ``run_settings(options)`` describes parsed options;
    ``check_inputs(checkpoints, tasks, options)`` raises on bad checkpoints or data before any cell runs.
    ``random_init``: whether its tasks accept ``random-init:<checkpoint>`` entries (see
    ``robust_pretrain.evaluation.checkpoints``).
    """

    name: str
    description: str  # one line above the score table, e.g. "GLUE dev scores x100"
    tasks: tuple[SuiteTask, ...]
    default_tasks: tuple[str, ...]
    option_types: tuple[type, ...]
    run_settings: Callable[[Sequence[Any]], RunSettings]
    check_inputs: Callable[[Sequence[str], Sequence[SuiteTask], Sequence[Any]], None]
    random_init: bool = False

    def task(self, name: str) -> SuiteTask:
        """Look a task up by name (case-insensitive, ``-`` ignored: ``SST-2`` is ``sst2``)."""
        wanted = _normalise(name)
        for task in self.tasks:
            if _normalise(task.name) == wanted:
                return task
        raise UsageError(
            f"Unknown {self.name} task {name!r}; expected one of: {', '.join(task.name for task in self.tasks)}"
        )


def _normalise(name: str) -> str:
    return name.lower().replace("-", "")


def register_family(family: TaskFamily) -> None:
    """Make ``family`` selectable with ``--family`` in this process (a family of the same name is replaced)."""
    _REGISTERED[family.name] = family


def family_names() -> list[str]:
    return sorted({*FAMILY_MODULES, *_REGISTERED})


def get_family(name: str) -> TaskFamily:
    """The registered family ``name``, importing its module on first use."""
    if name not in _REGISTERED:
        if name not in FAMILY_MODULES:
            raise UsageError(f"Unknown task family {name!r}; expected one of: {', '.join(family_names())}")
        register_family(importlib.import_module(FAMILY_MODULES[name]).FAMILY)
    return _REGISTERED[name]
