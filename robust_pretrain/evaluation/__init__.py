"""One task-agnostic evaluation suite (checkpoints x tasks x seeds, average and worst task) over a task table."""

from robust_pretrain.evaluation.suite import SuiteArguments, main, run_suite
from robust_pretrain.evaluation.tasks import (
    ModelIndexTarget,
    RunSettings,
    SuiteTask,
    TaskFamily,
    TaskRunner,
    TaskRunResult,
    get_family,
    register_family,
)

__all__ = [
    "ModelIndexTarget",
    "RunSettings",
    "SuiteArguments",
    "SuiteTask",
    "TaskFamily",
    "TaskRunResult",
    "TaskRunner",
    "get_family",
    "main",
    "register_family",
    "run_suite",
]
