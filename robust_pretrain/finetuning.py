"""What the fine-tuning recipes of every modality share: LoRA options, the output-directory rule, train logging.

Text (:mod:`robust_pretrain.glue.finetune`) and vision (:mod:`robust_pretrain.vision.finetune`) never import each
other; both use these.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robust_pretrain.cli import UsageError

if TYPE_CHECKING:
    from transformers import Trainer

# What an earlier run leaves that must not survive beside a new model (the rest is overwritten file by file).
STALE_OUTPUTS = ("checkpoint-*", "*.safetensors", "model.safetensors.index.json", "adapter_config.json", "*.bin")


@dataclass
class LoraArguments:
    """Optional LoRA fine-tuning via peft (the task head is trained fully and saved with the adapter)."""

    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all weights."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling alpha."})
    lora_dropout: float = field(default=0.1, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["query", "value"], metadata={"help": "Module names that get LoRA adapters."}
    )


def prepare_output_dir(
    output_dir: str | Path, overwrite: bool, delete_stale: bool = True, stale_outputs: Sequence[str] = ()
) -> None:
    """Refuse an ``output_dir`` holding files unless ``overwrite``; then (if ``delete_stale``: the main process)
    delete an earlier run's outputs (:data:`STALE_OUTPUTS` and the recipe's ``stale_outputs`` patterns) that would
    otherwise remain beside the new model."""
    path = Path(output_dir)
    existing = sorted(child.name for child in path.iterdir()) if path.is_dir() else []
    if existing and not overwrite:
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise UsageError(
            f"--output_dir {path} already holds files of an earlier run ({shown}); choose another --output_dir or "
            "pass --overwrite_output_dir true (deletes its checkpoint-* folders, weights and predictions first)"
        )
    for pattern in (*STALE_OUTPUTS, *stale_outputs) if existing and delete_stale else ():
        for stale in path.glob(pattern):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    path.mkdir(parents=True, exist_ok=True)


def log_train_results(trainer: Trainer, train_result: Any, num_samples: int) -> None:
    """Log and save the training metrics (with ``train_samples``) and the trainer state, as HF's example scripts do."""
    metrics = {**train_result.metrics, "train_samples": num_samples}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
