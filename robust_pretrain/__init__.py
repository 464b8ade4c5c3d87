"""robust-pretrain: task-robust (worst-case) pre-training on top of the Hugging Face Trainer.

The trainer and its arguments import transformers; they load on first access so that light entry points (the
``robust-pretrain-publish`` command, tagging workers) start fast. Importing the package makes transformers' Auto classes
find the MM-MAE classes, which load on the first MM-MAE lookup (see
``robust_pretrain.vision.multimae.auto_registration``). The old names of moved modules that saved files hold
(``MOVED_MODULES``) import the modules under their new names.
"""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_loader
from types import ModuleType
from typing import Any

from robust_pretrain.vision.multimae.auto_registration import install_auto_registration

__version__ = "0.1.0"

_LAZY = {
    "MinimaxTrainer": "robust_pretrain.trainer",
    "MinimaxTrainingArguments": "robust_pretrain.trainer.training_args",
    "WEIGHTINGS": "robust_pretrain.weighting",
    "Weighting": "robust_pretrain.weighting",
    "build_weighting": "robust_pretrain.weighting",
}
__all__ = sorted(_LAZY)

#: old module name -> where the module lives now, for the names that files already saved hold: ``training_args.bin``,
#: which the Trainer pickles into every output and checkpoint folder, names its arguments' class by module
#: (``MinimaxTrainingArguments`` of the pre-training recipes, ``DenseTrainingArguments`` of the dense fine-tuning), and
#: ``torch.load`` imports that module.
MOVED_MODULES = {
    "robust_pretrain.training_args": "robust_pretrain.trainer.training_args",
    "robust_pretrain.vision.finetune_arguments": "robust_pretrain.vision.finetune.arguments",
}


class _MovedModules:
    """Finds a moved module's old name (after every other finder) and imports it as the module itself, the same
    object under its new name."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        return spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = import_module(MOVED_MODULES[module.__name__])  # the import returns this entry


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
# transformers' Auto classes find the MM-MAE classes (no import of transformers here, none while it imports).
install_auto_registration()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
