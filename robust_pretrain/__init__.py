"""robust-pretrain: task-robust (worst-case) pre-training on top of the Hugging Face Trainer.

The trainer and its arguments import transformers; they load on first access so that light entry points (the
``robust-pretrain-publish`` command, tagging workers) start fast. Importing the package makes transformers' Auto classes
find the MM-MAE classes, which load on the first MM-MAE lookup (see :mod:`robust_pretrain.vision.auto_registration`).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from robust_pretrain.vision.auto_registration import install_auto_registration

__version__ = "0.1.0"

_LAZY = {
    "MinimaxTrainer": "robust_pretrain.trainer",
    "MinimaxTrainingArguments": "robust_pretrain.training_args",
    "WEIGHTINGS": "robust_pretrain.weighting",
    "Weighting": "robust_pretrain.weighting",
    "build_weighting": "robust_pretrain.weighting",
}
__all__ = sorted(_LAZY)

# transformers' Auto classes find the MM-MAE classes (no import of transformers here, none while it imports).
install_auto_registration()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
