"""Train-step time and peak memory of MinimaxTrainer against two plain Trainers on the same BERT masked LM.

The two baselines, in the same run: ``plain-full-logits``, the plain ``Trainer`` on ``BertForMaskedLM`` (vocabulary
logits at every position: the naive pipeline), and ``plain-sparse-head``, the best plain-HF practice, the plain
``Trainer`` on :class:`baselines.SparsePredictionBertForMaskedLM` (hidden states gathered where ``labels != -100``
before the MLM head, as Google's BERT and ModernBERT do). MinimaxTrainer computes logits at the targets only too
(``sparse_mlm_head``, on by default; ``minimax-full-logits`` turns it off), so the speed-up over the naive pipeline is
that sparse head, not the weighting: the ratio to ``plain-sparse-head`` is the method's own cost.

Every configuration gets its own copy of the same model and the same batches. Steps are interleaved (one step of each
configuration per round, the order reversed every other round), so machine noise hits all of them alike; a reported
ratio is the median over rounds of the per-round ratio (with the quartiles of the per-round ratios to the sparse
head). A step is what the Trainer's loop does per optimizer step: ``get_batch_samples`` + ``training_step`` (forward,
per-task reduce, weigh, backward) + ``optimizer.step``, with ``--threads`` torch threads. Peak memory is the peak RSS
of a separate process running only that configuration (VmHWM on CPU), or the peak allocated CUDA memory on a GPU.

    python benchmarks/bench_trainer_step.py              # writes benchmarks/results/trainer_step.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from baselines import SparsePredictionBertForMaskedLM
from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

from robust_pretrain import WEIGHTINGS, MinimaxTrainer, MinimaxTrainingArguments

RESULTS = Path(__file__).with_name("results")
TASKS = ["verb", "noun", "adjective", "determiner", "adverb", "pronoun", "preposition", "conjunction", "interjection"]
NAIVE, BEST_PRACTICE = "plain-full-logits", "plain-sparse-head"
PLAIN = (NAIVE, BEST_PRACTICE)
CONFIGS = [*PLAIN, *WEIGHTINGS, "minimax-full-logits"]


def make_batches(n: int, batch: int, seq: int, vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=g)
        target = torch.rand(batch, seq, generator=g) < 0.15
        batches.append(
            {
                "input_ids": torch.where(target, 103, ids),
                "attention_mask": torch.ones(batch, seq, dtype=torch.long),
                "labels": torch.where(target, ids, -100),
                "task_ids": torch.where(target, torch.randint(0, len(TASKS), (batch, seq), generator=g), -100),
            }
        )
    return batches


def bert_config(layers: int, hidden: int, seq: int) -> BertConfig:
    """A BERT of ``layers`` layers of width ``hidden`` (heads of 64, FFN 4x) for sequences of ``seq`` tokens."""
    return BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=max(512, seq),
    )


def make_trainer(config: str, out: str, layers: int, hidden: int, seq: int) -> Trainer:
    torch.manual_seed(0)
    bert = bert_config(layers, hidden, seq)
    model = (SparsePredictionBertForMaskedLM if config == BEST_PRACTICE else BertForMaskedLM)(bert)
    common = dict(
        output_dir=out,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        learning_rate=1e-4,
        max_grad_norm=0.0,
        disable_tqdm=True,
    )
    if config in PLAIN:
        return Trainer(model=model, args=TrainingArguments(**common))
    weighting = "minimax" if config == "minimax-full-logits" else config
    args = MinimaxTrainingArguments(
        **common, task_names=TASKS, weighting=weighting, sparse_mlm_head=config != "minimax-full-logits"
    )
    return MinimaxTrainer(model=model, args=args)


def step(trainer: Trainer, micro_batches: list[dict[str, torch.Tensor]], plain: bool) -> None:
    """One optimizer step as the Trainer's loop runs it over ``micro_batches`` (``task_ids`` dropped if ``plain``)."""
    device = trainer.args.device
    inputs = [{k: v.to(device) for k, v in b.items() if not (plain and k == "task_ids")} for b in micro_batches]
    samples, num_items = trainer.get_batch_samples(iter(inputs), len(inputs), device)
    trainer.current_gradient_accumulation_steps = len(inputs)
    for sample in samples:
        trainer.training_step(trainer.model, sample, num_items)
    trainer.optimizer.step()
    trainer.model.zero_grad()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prepare(trainer: Trainer) -> None:
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer.model.to(trainer.args.device)


def time_interleaved(configs: list[str], rounds: int, warmup: int, cli: argparse.Namespace) -> dict[str, list[float]]:
    batches = make_batches(rounds + warmup, cli.batch_size, cli.seq_len, 30522)
    with tempfile.TemporaryDirectory() as out:
        trainers = {c: make_trainer(c, out, cli.layers, cli.hidden, cli.seq_len) for c in configs}
        for trainer in trainers.values():
            prepare(trainer)
        times: dict[str, list[float]] = {c: [] for c in configs}
        for i, batch in enumerate(batches):
            order = configs if i % 2 == 0 else configs[::-1]
            for config in order:
                batch_on_device = {k: v.to(trainers[config].args.device) for k, v in batch.items()}
                start = time.perf_counter()
                step(trainers[config], [batch_on_device], config in PLAIN)
                if i >= warmup:
                    times[config].append(time.perf_counter() - start)
    return times


def peak_memory_mb(config: str, cli: argparse.Namespace) -> float:
    """Peak memory of a process that runs only ``config`` for a few steps."""
    command = [
        sys.executable,
        __file__,
        "--memory-of",
        config,
        "--layers",
        str(cli.layers),
        "--hidden",
        str(cli.hidden),
        "--seq-len",
        str(cli.seq_len),
        "--batch-size",
        str(cli.batch_size),
        "--threads",
        str(cli.threads),
    ]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def measure_memory_here(config: str, cli: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(config, out, cli.layers, cli.hidden, cli.seq_len)
        prepare(trainer)
        for batch in make_batches(4, cli.batch_size, cli.seq_len, 30522):
            step(trainer, [{k: v.to(trainer.args.device) for k, v in batch.items()}], config in PLAIN)
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    # VmHWM is this process's own peak RSS (ru_maxrss would include the parent's peak, inherited at fork)
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30, help="timed steps per configuration (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    parser.add_argument("--no-memory", action="store_true", help="time only (no peak-memory processes)")
    parser.add_argument("--results", default=str(RESULTS / "trainer_step"), help="output path without extension")
    parser.add_argument("--memory-of", choices=CONFIGS, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    if cli.memory_of:
        print(measure_memory_here(cli.memory_of, cli))
        return
    rows, setup = run(cli)
    write_results(Path(cli.results), rows, setup, " ".join(["python", *sys.argv]))


def run(cli: argparse.Namespace) -> tuple[list[dict], dict]:
    """Time the configurations (both plain baselines always included) and measure their peak memory."""
    configs = [*PLAIN, *(c for c in cli.configs if c not in PLAIN)]
    load = os.getloadavg()[0]
    times = time_interleaved(configs, cli.rounds, cli.warmup, cli)
    memory = {} if cli.no_memory else {c: peak_memory_mb(c, cli) for c in configs}

    def ratios(config: str, baseline: str) -> list[float]:
        return [t / b for t, b in zip(times[config], times[baseline], strict=True)]

    rows = [
        {
            "config": c,
            "median_step_s": statistics.median(times[c]),
            "time_vs_full_logits": statistics.median(ratios(c, NAIVE)),
            "time_vs_sparse_head": statistics.median(ratios(c, BEST_PRACTICE)),
            "time_vs_sparse_head_quartiles": quartiles(ratios(c, BEST_PRACTICE)),
            "peak_memory_mb": memory.get(c),
            "memory_vs_sparse_head": memory[c] / memory[BEST_PRACTICE] if memory else None,
        }
        for c in configs
    ]
    device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu"
    setup = {
        "model": f"BertForMaskedLM {cli.layers} layers, hidden {cli.hidden}, vocabulary 30522",
        "seq_len": cli.seq_len,
        "batch_size": cli.batch_size,
        "targets": "15 % of positions",
        "tasks": len(TASKS),
        "rounds": cli.rounds,
        "device": device,
        "threads": torch.get_num_threads(),
        "load_average_1min_at_start": round(load, 2),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    return rows, setup


def quartiles(values: list[float]) -> list[float]:
    """First and third quartile (the spread of the per-round ratios); the value itself for one round."""
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4)
    return [q1, q3]


def write_results(stem: Path, rows: list[dict], setup: dict, command: str) -> None:
    """``<stem>.json`` and ``<stem>.md`` (the table)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "setup": setup, "results": rows}, indent=1))
    lines = [f"Command: `{command}`", "", f"Setup: {json.dumps(setup)}", "", *table(rows)]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def table(rows: list[dict]) -> list[str]:
    """The results as the lines of a Markdown table."""

    def number(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    return [
        "| configuration | median step (s) | time vs plain full-logits | time vs plain sparse-head (quartiles) "
        "| peak memory (MB) | memory vs plain sparse-head |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['config']} | {r['median_step_s']:.4f} | {r['time_vs_full_logits']:.3f} | "
            f"{r['time_vs_sparse_head']:.3f} ({r['time_vs_sparse_head_quartiles'][0]:.3f}-"
            f"{r['time_vs_sparse_head_quartiles'][1]:.3f}) | {number(r['peak_memory_mb'], 0)} | "
            f"{number(r['memory_vs_sparse_head'], 3)} |"
            for r in rows
        ),
    ]


if __name__ == "__main__":
    main()
