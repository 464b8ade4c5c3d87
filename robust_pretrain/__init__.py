"""robust-pretrain: task-robust (worst-case) pre-training on top of the Hugging Face Trainer."""

__version__ = "0.1.0"
