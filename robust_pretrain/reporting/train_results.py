"""What the fine-tuning recipes of every modality share: train logging (LoRA options: :mod:`robust_pretrain.options`,
the output-directory rule: :mod:`robust_pretrain.output_dir`).

Text (:mod:`robust_pretrain.glue.finetune`) and vision (:mod:`robust_pretrain.vision.finetune.recipe`) never import each
other; both use these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import Trainer


def log_train_results(trainer: Trainer, train_result: Any, num_samples: int) -> None:
    """Log and save the training metrics (with ``train_samples``) and the trainer state, as HF's example scripts do."""
    metrics = {**train_result.metrics, "train_samples": num_samples}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
