"""Peak memory and step time of a decoder step: MinimaxTrainer's chunked next-token loss against the plain Trainer.

The same Llama-style model (vocabulary 32k, sequences of 512 tokens, a small hidden size so it runs on a CPU) and the
same batches for every configuration:

* ``plain``: ``transformers.Trainer`` with the model's own loss (``ForCausalLMLoss`` over ``[batch, seq, vocab]``
  logits). Transformers 5.24 has no built-in option that cuts a training step's logits memory other than
  ``use_liger_kernel`` (a Triton kernel: it needs the ``liger-kernel`` package and a GPU); ``logits_to_keep`` only
  serves generation, where one position's logits are needed. So the plain Trainer as it is, is the baseline.
* ``checkpointed<N>``: the plain Trainer with :class:`baselines.CheckpointedChunkedLossTrainer` (``lm_head`` on N
  positions at a time under ``torch.utils.checkpoint``: the alternative a user writes), only with ``--configs``.
* ``minimax-full``: ``MinimaxTrainer`` (weighting ``minimax``) with ``causal_lm_chunk_size=0``: the model's logits.
* ``minimax-default``: ``MinimaxTrainer`` with ``causal_lm_chunk_size`` unset (from the shapes), only with
  ``--configs``.
* ``minimax-chunk<N>``: ``MinimaxTrainer`` with ``causal_lm_chunk_size=N``.
* ``minimax-chunk128-reference``: the same with a same-size reference model (``--reference_model``, DoReMi's online
  excess), whose forward pass runs through the same sliced loss without gradient.

Step time: every configuration lives in one process with its own copy of the model; one step of each per round, in
alternating order, so machine load hits them alike; the ratio to ``plain`` is taken within each round, the median
over rounds is reported. A step is ``get_batch_samples`` + ``training_step`` (forward, loss, backward) +
``optimizer.step``, as the Trainer's loop runs it.

Peak memory: a fresh process per configuration and repetition runs one warm-up step (optimizer state allocated),
then reads its resident set (``VmRSS``), resets the kernel's peak counter (``/proc/self/clear_refs``) and runs two
more steps; the step's peak is ``VmHWM - VmRSS`` (the memory a step adds on top of model, optimizer state and data).
glibc keeps freed memory in its heap, where the RSS would not drop between tensors; the processes run with
``MALLOC_MMAP_THRESHOLD_=65536`` so every tensor larger than 64 KiB is its own mapping, returned to the kernel when
freed, and the RSS follows the tensors alive.

Decision rule for the default ``causal_lm_chunk_size`` (written before the run): the chunk size with the lowest
median step-time ratio among those whose step peak memory is at most 0.5x the plain Trainer's; where step-time ratios
differ by less than 0.03, the smaller chunk (less memory).

    python benchmarks/bench_causal_lm_memory.py   # writes benchmarks/results/causal_lm_memory.{json,md}
    python benchmarks/bench_causal_lm_memory.py --batch-size 4 --hidden 128 --configs plain minimax-chunk128 \
        --name causal_lm_memory_b4_h128           # the default chunk size at 4x the targets
    python benchmarks/bench_causal_lm_memory.py --vocab 128256 --hidden 256 --seq-len 256 --configs plain \
        checkpointed128 checkpointed512 minimax-default minimax-chunk512 --rounds 5 --warmup 1 \
        --name causal_lm_memory_v128k_h256        # vocabulary 128k, hidden 256: against the checkpointed loss
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
from baselines import CheckpointedChunkedLossTrainer
from bench_trainer_step import prepare, step
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

RESULTS = Path(__file__).with_name("results")
DOMAINS = ["news", "code", "web"]
CHUNK_SIZES = [128, 256, 512, 1024]
CHECKPOINTED_CHUNKS = [128, 512]
CONFIGS = [
    "plain",
    *(f"checkpointed{n}" for n in CHECKPOINTED_CHUNKS),
    "minimax-full",
    "minimax-default",
    *(f"minimax-chunk{n}" for n in CHUNK_SIZES),
    "minimax-chunk128-reference",
]
#: the configurations run when --configs is not given (the checkpointed and default ones came later)
DEFAULT_CONFIGS = ["plain", "minimax-full", *(f"minimax-chunk{n}" for n in CHUNK_SIZES), "minimax-chunk128-reference"]
REFERENCE = "-reference"  # a configuration with a same-size reference model (--reference_model, the online excess)
MMAP_THRESHOLD = 65536


def make_batches(n: int, cli: argparse.Namespace, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, cli.vocab, (cli.batch_size, cli.seq_len), generator=g)
        batches.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": ids.clone(),
                "task_ids": torch.arange(cli.batch_size) % len(DOMAINS),
            }
        )
    return batches


def make_trainer(config: str, out: str, cli: argparse.Namespace) -> Trainer:
    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=cli.vocab,
        hidden_size=cli.hidden,
        intermediate_size=cli.hidden * 8 // 3,
        num_hidden_layers=cli.layers,
        num_attention_heads=max(1, cli.hidden // 64),
        num_key_value_heads=max(1, cli.hidden // 128),
        max_position_embeddings=cli.seq_len,
    )
    if config.endswith(REFERENCE):
        torch.manual_seed(1)
        LlamaForCausalLM(llama).save_pretrained(f"{out}/reference")
        torch.manual_seed(0)
    model = LlamaForCausalLM(llama)
    common = dict(
        output_dir=out, report_to=[], use_cpu=not torch.cuda.is_available(), learning_rate=1e-4, disable_tqdm=True
    )
    if config == "plain":
        return Trainer(model=model, args=TrainingArguments(**common))
    if config.startswith("checkpointed"):
        chunk = int(config.removeprefix("checkpointed"))
        return CheckpointedChunkedLossTrainer(model=model, args=TrainingArguments(**common), chunk=chunk)
    reference = dict(loss_normalization="excess", reference_model=f"{out}/reference") if REFERENCE in config else {}
    if config == "minimax-default":  # causal_lm_chunk_size unset: from the shapes
        chunking = {}
    else:
        chunk = 0 if config == "minimax-full" else int(config.removeprefix("minimax-chunk").removesuffix(REFERENCE))
        chunking = {"causal_lm_chunk_size": chunk}
    args = MinimaxTrainingArguments(**common, task_names=DOMAINS, weighting="minimax", **chunking, **reference)
    return MinimaxTrainer(model=model, args=args)


def time_interleaved(configs: list[str], cli: argparse.Namespace) -> dict[str, list[float]]:
    batches = make_batches(cli.rounds + cli.warmup, cli)
    with tempfile.TemporaryDirectory() as out:
        trainers = {c: make_trainer(c, out, cli) for c in configs}
        for trainer in trainers.values():
            prepare(trainer)
        times: dict[str, list[float]] = {c: [] for c in configs}
        for i, batch in enumerate(batches):
            for config in configs if i % 2 == 0 else configs[::-1]:
                start = time.perf_counter()
                step(trainers[config], [batch], not config.startswith("minimax"))
                if i >= cli.warmup:
                    times[config].append(time.perf_counter() - start)
            print(f"round {i}: " + ", ".join(f"{c} {times[c][-1]:.2f}s" for c in configs if times[c]), flush=True)
    return times


def proc_status_mb(field: str) -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith(f"{field}:")).split()[1]) / 1024


def measure_step_memory_here(config: str, cli: argparse.Namespace) -> dict[str, float]:
    """One warm-up step, then the peak memory two more steps add (MB); see the module docstring."""
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(config, out, cli)
        prepare(trainer)
        warmup, *measured = make_batches(3, cli)
        step(trainer, [warmup], not config.startswith("minimax"))
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            baseline = torch.cuda.memory_allocated() / 2**20
        else:
            baseline = proc_status_mb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        for batch in measured:
            step(trainer, [batch], not config.startswith("minimax"))
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else proc_status_mb("VmHWM")
    return {"baseline_mb": baseline, "peak_mb": peak, "step_peak_mb": peak - baseline}


def step_memory(config: str, cli: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--memory-of", config, *shape_options(cli)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(output.strip().splitlines()[-1])


def shape_options(cli: argparse.Namespace) -> list[str]:
    names = ("vocab", "seq_len", "batch_size", "hidden", "layers")
    return [part for name in names for part in (f"--{name.replace('_', '-')}", str(getattr(cli, name)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="timed steps per configuration (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-repeats", type=int, default=1, help="processes per configuration (median)")
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=CONFIGS)
    parser.add_argument("--name", default="causal_lm_memory", help="results file name, without extension")
    parser.add_argument("--memory-of", choices=CONFIGS, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    torch.set_num_threads(1)
    if cli.memory_of:
        print(json.dumps(measure_step_memory_here(cli.memory_of, cli)))
        return
    configs = ["plain", *(c for c in cli.configs if c != "plain")]
    memory = {c: [] for c in configs}
    for _ in range(cli.memory_repeats):  # interleaved too: one process per configuration per repetition
        for config in configs:
            memory[config].append(step_memory(config, cli))
    times = time_interleaved(configs, cli)
    step_peak = {c: statistics.median(m["step_peak_mb"] for m in memory[c]) for c in configs}
    rows = [
        {
            "config": c,
            "median_step_s": statistics.median(times[c]),
            "time_ratio": statistics.median(t / p for t, p in zip(times[c], times["plain"], strict=True)),
            "step_peak_mb": step_peak[c],
            "process_peak_mb": statistics.median(m["peak_mb"] for m in memory[c]),
            "memory_ratio": step_peak[c] / step_peak["plain"],
            "step_peak_mb_each": [round(m["step_peak_mb"], 1) for m in memory[c]],
        }
        for c in configs
    ]
    logits_mb = cli.batch_size * cli.seq_len * cli.vocab * 4 / 2**20
    setup = {
        "model": f"LlamaForCausalLM {cli.layers} layers, hidden {cli.hidden}, vocab {cli.vocab}",
        "seq_len": cli.seq_len,
        "batch_size": cli.batch_size,
        "fp32_logits_mb": round(logits_mb, 1),
        "domains": len(DOMAINS),
        "rounds": cli.rounds,
        "memory_repeats": cli.memory_repeats,
        "device": "cuda" if torch.cuda.is_available() else "cpu (1 thread)",
        "torch": torch.__version__,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{cli.name}.json").write_text(json.dumps({"setup": setup, "results": rows}, indent=1))
    command = " ".join(["python", "benchmarks/bench_causal_lm_memory.py", *sys.argv[1:]])
    lines = [
        f"Command: `{command}`",
        "",
        f"Setup: {json.dumps(setup)}",
        "",
        "| configuration | median step (s) | time vs plain Trainer | step peak memory (MB) | memory vs plain | "
        "process peak (MB) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {r['median_step_s']:.3f} | {r['time_ratio']:.3f} | {r['step_peak_mb']:.0f} | "
        f"{r['memory_ratio']:.3f} | {r['process_peak_mb']:.0f} |"
        for r in rows
    ]
    (RESULTS / f"{cli.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
