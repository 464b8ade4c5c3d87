"""robust-pretrain: task-robust (worst-case) pre-training on top of the Hugging Face Trainer."""

__version__ = "0.1.0"

from .trainer import MinimaxTrainer
from .training_args import MinimaxTrainingArguments
from .weighting import WEIGHTINGS, Weighting, build_weighting

__all__ = ["WEIGHTINGS", "MinimaxTrainer", "MinimaxTrainingArguments", "Weighting", "build_weighting"]
