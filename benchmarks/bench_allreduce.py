"""What minimax adds per optimizer step in data-parallel training: its all-reduces against a whole training step.

Beyond DDP's gradient all-reduce, ``MinimaxTrainer`` exchanges only per-task statistics between processes: per
optimizer step, the global per-task target counts (T floats, in ``get_batch_samples``) and, at the step's first
micro-batch, the per-task loss sums and counts (2T floats) from which every process computes the same weights
(O(T) arithmetic). This script runs a real ``MinimaxTrainer.train()`` of a small BertForMaskedLM on 2 CPU processes
(``torchrun``, gloo, one thread each) and, for every optimizer step (a round), records:

- ``step``: wall time of one optimizer step of the Trainer's own loop (data, forward, backward with DDP's gradient
  all-reduce, optimizer), between consecutive ``on_step_end`` callbacks, the measurements below excluded;
- ``in-step all-reduce``: time spent inside ``MinimaxTrainer._all_reduce`` during that step, and the number of calls.
  Each call is preceded by a timed barrier, so the time a rank waits for the other (rank skew, which DDP's gradient
  all-reduce would absorb anyway) is reported apart from the all-reduce proper;
- ``all-reduce latency``: median of back-to-back all-reduces of 2T float32 right after a barrier (no rank skew);
- ``weights arithmetic``: median time of the weighting strategy's ``weights()`` on T-sized tensors.

Each round's ratios use that round's step, so machine noise hits numerator and denominator alike; the medians over
rounds are reported (rank 0's view). A message-size sweep of the same all-reduce closes the run.

    python benchmarks/bench_allreduce.py          # writes benchmarks/results/allreduce.{json,md}
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
import torch.distributed as dist
from bench_trainer_step import TASKS, make_batches
from datasets import Dataset
from transformers import BertConfig, BertForMaskedLM, TrainerCallback

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

RESULTS = Path(__file__).with_name("results")
SWEEP_FLOATS = (2 * len(TASKS), 1024, 65_536, 1_048_576)


class TimedMinimaxTrainer(MinimaxTrainer):
    """``MinimaxTrainer`` that accounts its own all-reduces: number, time waiting for the other rank, time proper."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reset_counters()

    def reset_counters(self) -> None:
        self.wait_seconds = self.allreduce_seconds = 0.0
        self.allreduce_calls = 0

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        dist.barrier()
        synchronized = time.perf_counter()
        reduced = super()._all_reduce(tensor)
        self.wait_seconds += synchronized - start
        self.allreduce_seconds += time.perf_counter() - synchronized
        self.allreduce_calls += 1
        return reduced


def median_seconds(operation, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def all_reduce_latency(trainer: MinimaxTrainer, num_floats: int, repeats: int) -> float:
    """Median time of one all-reduce of ``num_floats`` float32 through the trainer's accelerator, after a barrier."""
    tensor = torch.ones(num_floats)
    dist.barrier()
    return median_seconds(lambda: trainer.accelerator.reduce(tensor, reduction="sum"), repeats)


class RoundRecorder(TrainerCallback):
    """Per optimizer step: step time and in-step all-reduces, then the latency and arithmetic micro-measurements."""

    def __init__(self, trainer: TimedMinimaxTrainer, repeats: int) -> None:
        self.trainer, self.repeats = trainer, repeats
        self.rounds: list[dict[str, float]] = []
        self.weighting = trainer.args.build_weighting()  # a separate instance: the run's weighting state is untouched
        num_tasks = trainer.num_tasks
        self.losses, self.present = torch.rand(num_tasks) + 1.0, torch.ones(num_tasks, dtype=torch.bool)
        self.mark = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.mark = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_seconds = time.perf_counter() - self.mark
        trainer = self.trainer
        self.rounds.append(
            {
                "step_s": step_seconds,
                "in_step_allreduce_s": trainer.allreduce_seconds,
                "in_step_wait_s": trainer.wait_seconds,
                "allreduce_calls": trainer.allreduce_calls,
                "allreduce_latency_s": all_reduce_latency(trainer, 2 * trainer.num_tasks, self.repeats),
                "weights_arithmetic_s": median_seconds(
                    lambda: self.weighting.weights(self.losses, self.present), self.repeats
                ),
            }
        )
        trainer.reset_counters()
        dist.barrier()
        self.mark = time.perf_counter()


def build_trainer(cli: argparse.Namespace, out: str) -> TimedMinimaxTrainer:
    steps = cli.warmup + cli.rounds
    world = int(os.environ["WORLD_SIZE"])
    batches = make_batches(steps * world * cli.grad_accum, cli.batch_size, cli.seq_len, 30522)
    columns = {key: torch.cat([batch[key] for batch in batches]).tolist() for key in batches[0]}
    torch.manual_seed(0)
    hidden = cli.hidden
    model = BertForMaskedLM(
        BertConfig(
            num_hidden_layers=cli.layers,
            hidden_size=hidden,
            num_attention_heads=max(1, hidden // 64),
            intermediate_size=4 * hidden,
            max_position_embeddings=max(512, cli.seq_len),
        )
    )
    args = MinimaxTrainingArguments(
        output_dir=out,
        task_names=TASKS,
        weighting="minimax",
        per_device_train_batch_size=cli.batch_size,
        gradient_accumulation_steps=cli.grad_accum,
        max_steps=steps,
        learning_rate=1e-4,
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return TimedMinimaxTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns))


def summarize(rounds: list[dict[str, float]], sweep: dict[int, float], cli: argparse.Namespace) -> dict:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def median_ratio(numerator) -> float:
        return statistics.median(numerator(r) / r["step_s"] for r in rounds)

    calls = sorted({r["allreduce_calls"] for r in rounds})
    return {
        "setup": {
            "model": f"BertForMaskedLM {cli.layers} layers, hidden {cli.hidden}, vocab 30522",
            "seq_len": cli.seq_len,
            "per_process_batch": cli.batch_size,
            "gradient_accumulation_steps": cli.grad_accum,
            "processes": 2,
            "backend": "gloo (CPU), torchrun, OMP_NUM_THREADS=1 per process",
            "tasks": len(TASKS),
            "rounds": len(rounds),
            "warmup_steps_dropped": cli.warmup,
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
        },
        "median_step_s": median("step_s"),
        "allreduce_calls_per_step": calls,
        "median_in_step_allreduce_s": median("in_step_allreduce_s"),
        "median_in_step_wait_s": median("in_step_wait_s"),
        "median_allreduce_latency_s": median("allreduce_latency_s"),
        "median_weights_arithmetic_s": median("weights_arithmetic_s"),
        "ratio_in_step_allreduce_to_step": median_ratio(lambda r: r["in_step_allreduce_s"]),
        "ratio_in_step_wait_to_step": median_ratio(lambda r: r["in_step_wait_s"]),
        "ratio_latency_x_calls_to_step": median_ratio(lambda r: r["allreduce_latency_s"] * r["allreduce_calls"]),
        "ratio_weights_arithmetic_to_step": median_ratio(lambda r: r["weights_arithmetic_s"]),
        "allreduce_latency_by_floats_s": {str(n): seconds for n, seconds in sweep.items()},
        "rounds": rounds,
    }


def render_markdown(result: dict) -> str:
    us = 1e6
    lines = [
        f"Setup: {json.dumps(result['setup'])}",
        "",
        "| quantity (median over rounds) | value | share of the step |",
        "|---|---|---|",
        f"| optimizer step of MinimaxTrainer (2 processes) | {result['median_step_s'] * 1e3:.1f} ms | 1 |",
        f"| minimax all-reduces per step | {', '.join(map(str, result['allreduce_calls_per_step']))} | |",
        f"| time inside those all-reduces, per step | "
        f"{result['median_in_step_allreduce_s'] * us:.0f} us | {result['ratio_in_step_allreduce_to_step']:.2e} |",
        f"| waiting for the other rank before them, per step (rank skew) | "
        f"{result['median_in_step_wait_s'] * us:.0f} us | {result['ratio_in_step_wait_to_step']:.2e} |",
        f"| latency of one all-reduce of 2T = {2 * result['setup']['tasks']} floats, after a barrier | "
        f"{result['median_allreduce_latency_s'] * us:.0f} us | {result['ratio_latency_x_calls_to_step']:.2e} "
        "(x calls) |",
        f"| weights arithmetic (minimax softmax, T = {result['setup']['tasks']}) | "
        f"{result['median_weights_arithmetic_s'] * us:.0f} us | {result['ratio_weights_arithmetic_to_step']:.2e} |",
        "",
        "| all-reduce size (float32) | median latency |",
        "|---|---|",
    ]
    lines += [
        f"| {int(n):,} ({int(n) * 4:,} B) | {seconds * us:.0f} us |"
        for n, seconds in result["allreduce_latency_by_floats_s"].items()
    ]
    return "\n".join(lines) + "\n"


def worker(cli: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(cli, out)
        recorder = RoundRecorder(trainer, cli.repeats)
        trainer.add_callback(recorder)
        trainer.train()
        sweep = {n: all_reduce_latency(trainer, n, cli.repeats) for n in SWEEP_FLOATS}
    if trainer.args.process_index == 0:
        result = summarize(recorder.rounds[cli.warmup :], sweep, cli)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "allreduce.json").write_text(json.dumps(result, indent=1) + "\n")
        markdown = render_markdown(result)
        (RESULTS / "allreduce.md").write_text(markdown)
        print(markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="per process and micro-batch")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--rounds", type=int, default=30, help="timed optimizer steps (medians reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30, help="repetitions of each micro-measurement per round")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        worker(cli)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]
    command += ["--worker", *sys.argv[1:]]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
