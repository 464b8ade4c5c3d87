"""MinimaxTrainer on a tiny MM-MAE where half the examples lack depth, run by the DDP test with two processes.

Writes ``rank<r>.json`` (per step: whether this rank's batch had depth; the logged task losses and weights) and
``params-rank<r>.safetensors`` (the trained parameters) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from tiny_vision import random_batch, tiny_config

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining


def collate_common_modalities(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack the keys every example has: a batch with one depth-less example has no depth (an absent task)."""
    keys = set.intersection(*(set(f) for f in features))
    return {key: torch.stack([f[key] for f in features]) for key in sorted(keys)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    batch = random_batch(batch=16)
    examples = [{key: value[i] for key, value in batch.items()} for i in range(16)]
    for i in range(0, 16, 2):
        examples[i] = {key: value for key, value in examples[i].items() if "depth" not in key}
    torch.manual_seed(0)
    model = MultiMAEForPreTraining(tiny_config())
    args = MinimaxTrainingArguments(
        output_dir=out,
        task_names=model.config.task_names,
        weighting="minimax",
        per_device_train_batch_size=2,
        max_steps=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=1,
    )
    trainer = MinimaxTrainer(model=model, args=args, train_dataset=examples, data_collator=collate_common_modalities)
    had_depth = []
    compute_loss = trainer.compute_loss

    def recording_compute_loss(model, inputs, *rest, **kwargs):
        had_depth.append("depth" in inputs)
        return compute_loss(model, inputs, *rest, **kwargs)

    trainer.compute_loss = recording_compute_loss
    trainer.train()
    rank = args.process_index
    logs = [{k: v for k, v in e.items() if k.startswith("task_")} for e in trainer.state.log_history if "loss" in e]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"had_depth": had_depth, "logs": logs}, f)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, f"params-rank{rank}.safetensors")
    )


if __name__ == "__main__":
    main()
