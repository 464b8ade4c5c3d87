"""Step time and recompilations of MinimaxTrainer with ``torch_compile=True`` (the target-only MLM head) on CPU.

Each optimizer step sees a new number of MLM targets (random 15 % masking), the case that makes dynamic shapes. Run
under 1 process or ``torchrun --nproc_per_node 2`` (DDP); writes one JSON per configuration.

    python benchmarks/bench_compile.py --out benchmarks/results/compile-1proc.json
    torchrun --nproc_per_node 2 benchmarks/bench_compile.py --out benchmarks/results/compile-2proc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
from datasets import Dataset
from torch._dynamo.utils import counters
from transformers import BertConfig, BertForMaskedLM, TrainerCallback

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

TASKS = ["verb", "noun", "adjective", "determiner", "adverb", "pronoun", "preposition", "conjunction", "interjection"]


def dataset(n: int, seq: int, vocab: int) -> Dataset:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (n, seq), generator=g)
    target = torch.rand(n, seq, generator=g) < 0.15
    tasks = torch.randint(0, len(TASKS), (n, seq), generator=g)
    return Dataset.from_dict(
        {
            "input_ids": torch.where(target, 4, ids).tolist(),
            "attention_mask": torch.ones(n, seq, dtype=torch.long).tolist(),
            "labels": torch.where(target, ids, -100).tolist(),
            "task_ids": torch.where(target, tasks, -100).tolist(),
        }
    )


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self.graphs: list[int] = []  # graphs compiled so far (first compilations + recompilations)

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)
        self.graphs.append(int(counters["stats"]["unique_graphs"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--compile", choices=["yes", "no"], default="yes")
    parser.add_argument("--backend", default="inductor", help="torch_compile_backend (eager: dynamo only)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    cli = parser.parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
        max_position_embeddings=cli.seq,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        args = MinimaxTrainingArguments(
            output_dir=tmp, task_names=TASKS, per_device_train_batch_size=cli.batch_size, max_steps=cli.steps,
            learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_steps=cli.steps,
            disable_tqdm=True, torch_compile=cli.compile == "yes", dataloader_drop_last=True,
            torch_compile_backend=cli.backend if cli.compile == "yes" else None,
        )  # fmt: skip
        data = dataset(cli.batch_size * cli.steps * 2, cli.seq, 1000)
        trainer = MinimaxTrainer(model=BertForMaskedLM(config), args=args, train_dataset=data)
        timer = StepTimer()
        trainer.add_callback(timer)
        started = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - started
    result = {
        "processes": args.world_size,
        "compile": cli.backend if cli.compile == "yes" else "no",
        "steps": cli.steps,
        "wall_s": round(total, 2),
        "first_step_s": round(timer.times[0], 3),
        "median_step_s_after_8": round(statistics.median(timer.times[8:]), 4),
        "step_s": [round(t, 4) for t in timer.times],
        "graphs_compiled_by_step": timer.graphs,
        "graph_breaks": int(counters["graph_break"].total()) if "graph_break" in counters else 0,
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "recompile_limit": torch._dynamo.config.recompile_limit,
    }
    if args.process_index == 0:
        Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cli.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "step_s"}))


if __name__ == "__main__":
    main()
