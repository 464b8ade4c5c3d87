"""Optimizer-step time of minimax with an online reference model (``--reference_model``, DoReMi's excess loss)
against the bare minimax step and the plain ``Trainer``, on the same BertForMaskedLM.

The reference model is a same-size BertForMaskedLM (another initialisation), the case of DoReMi and of issue 18's
protocol (a proportional run of the same size, trained longer). It runs without gradient on the first micro-batch of
each optimizer step only, so its share of the step falls with gradient accumulation: each configuration is measured
with ``gradient_accumulation_steps`` 1 and 4.

Steps are interleaved (one optimizer step of each configuration per round, the order reversed every other round), so
machine noise hits them alike; the reported ratio is the median over rounds of the per-round ratio to the bare
minimax step of the same accumulation.
A step is what the Trainer's loop does per optimizer step: ``get_batch_samples`` over the step's micro-batches, one
``training_step`` per micro-batch (forward, per-task reduce, weigh, backward) and ``optimizer.step``.

    python benchmarks/bench_reference_model.py        # writes benchmarks/results/reference_model.{json,md}
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_trainer_step import TASKS, bert_config, make_batches, prepare, step
from transformers import BertForMaskedLM, Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

RESULTS = Path(__file__).with_name("results")
CONFIGS = ("plain", "minimax", "minimax-reference")
VOCAB = 30522


def bert(layers: int, hidden: int, seq: int, seed: int) -> BertForMaskedLM:
    torch.manual_seed(seed)
    return BertForMaskedLM(bert_config(layers, hidden, seq))


def make_trainer(config: str, out: Path, reference: Path, cli: argparse.Namespace, accumulation: int) -> Trainer:
    model = bert(cli.layers, cli.hidden, cli.seq_len, seed=0)
    common = dict(
        output_dir=str(out / config),
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        learning_rate=1e-4,
        max_grad_norm=0.0,
        disable_tqdm=True,
        gradient_accumulation_steps=accumulation,
    )
    if config == "plain":
        return Trainer(model=model, args=TrainingArguments(**common))
    online = {"loss_normalization": "excess", "reference_model": str(reference)} if config.endswith("reference") else {}
    return MinimaxTrainer(model=model, args=MinimaxTrainingArguments(**common, task_names=TASKS, **online))


def time_interleaved(cli: argparse.Namespace, accumulation: int, out: Path, reference: Path) -> dict[str, list[float]]:
    trainers = {c: make_trainer(c, out, reference, cli, accumulation) for c in CONFIGS}
    for trainer in trainers.values():
        prepare(trainer)
        trainer.model.train()
    batches = make_batches((cli.rounds + cli.warmup) * accumulation, cli.batch_size, cli.seq_len, VOCAB)
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for i in range(cli.rounds + cli.warmup):
        micro_batches = batches[i * accumulation : (i + 1) * accumulation]
        for config in CONFIGS if i % 2 == 0 else CONFIGS[::-1]:
            start = time.perf_counter()
            step(trainers[config], micro_batches, config == "plain")
            if i >= cli.warmup:
                times[config].append(time.perf_counter() - start)
    return times


def summarise(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median step time of each configuration and the median per-round ratio to bare minimax."""
    return {
        config: {
            "median_step_s": statistics.median(values),
            "ratio_to_minimax": statistics.median(v / m for v, m in zip(values, times["minimax"], strict=True)),
        }
        for config, values in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=20, help="timed optimizer steps per configuration")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--accumulation", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--output", type=Path, default=RESULTS / "reference_model")
    cli = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    setup = {
        "model": f"BertForMaskedLM {cli.layers} layers, hidden {cli.hidden}; reference: the same size",
        "seq_len": cli.seq_len,
        "batch_size": cli.batch_size,
        "tasks": len(TASKS),
        "rounds": cli.rounds,
        "device": device,
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "reference"
        bert(cli.layers, cli.hidden, cli.seq_len, seed=1).save_pretrained(reference)
        for accumulation in cli.accumulation:
            times = time_interleaved(cli, accumulation, Path(tmp), reference)
            results[str(accumulation)] = {"summary": summarise(times), "times_s": times}
    command = "python benchmarks/bench_reference_model.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(cli).items()
        if k != "output"
    )
    cli.output.with_suffix(".json").write_text(json.dumps({"setup": setup, "command": command, **results}, indent=1))
    lines = [
        f"Setup: {json.dumps(setup)}",
        "",
        f"Command: `{command}`",
        "",
        "| gradient accumulation | configuration | median optimizer step (s) | time vs bare minimax (median ratio) |",
        "|---|---|---|---|",
    ]
    for accumulation, result in results.items():
        for config, row in result["summary"].items():
            lines.append(f"| {accumulation} | {config} | {row['median_step_s']:.4f} | {row['ratio_to_minimax']:.3f} |")
    cli.output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
