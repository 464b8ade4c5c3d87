"""A decoder's training step at a Llama-3-like head: MinimaxTrainer's sliced next-token loss against the plain Trainer
and against the checkpointed chunked loss a user would write, in time, peak memory and model-FLOP utilisation.

One Llama-style model (default: vocabulary 128,256, hidden 2,048, 4 layers, 4 x 2,048 tokens, bf16 autocast) and one
AdamW optimizer are shared by every configuration, so the optimizer's state exists once and the step differs only in
how the loss is computed:

* ``plain``: ``transformers.Trainer`` with the model's own loss (full ``[batch, seq, vocab]`` logits);
* ``checkpointed<N>``: the plain Trainer with :class:`baselines.CheckpointedChunkedLossTrainer` (``lm_head`` on N
  positions at a time under ``torch.utils.checkpoint``);
* ``torch-lce-mean``: the plain Trainer with :class:`baselines.LinearCrossEntropyTrainer` (PyTorch's
  ``F.linear_cross_entropy``, chunked, ``mean``: gradients in the forward pass);
* ``minimax-full``: ``MinimaxTrainer`` (weighting ``minimax``, 3 domains) with ``causal_lm_chunk_size=0``;
* ``minimax-default``: ``MinimaxTrainer`` with ``causal_lm_chunk_size`` unset (from the shapes: Liger's rule),
  ``weight_update='alternating'``: the first micro-batch recomputes the logits in the backward pass (``8VH`` FLOPs
  per target), later ones take the single pass (``6VH``);
* ``minimax-simultaneous``: the same with ``weight_update='simultaneous'``: every micro-batch on the single pass;
* ``minimax-chunk<N>``: ``MinimaxTrainer`` with ``causal_lm_chunk_size=N``.

Each round runs one step (``get_batch_samples`` + ``training_step`` over ``--accumulation`` micro-batches +
``optimizer.step``, as the Trainer's loop does) of every configuration, in alternating order; the time ratio to
``plain`` is taken within each round and its median over rounds reported. On the CPU the step's process CPU time
(``time.process_time``: every thread of the process, none of the other jobs on a shared machine) is timed besides the
wall clock and its ratio reported the same way: run with one thread (``OMP_NUM_THREADS=1``) so the CPU time is the
step's work, far less sensitive to other jobs than the wall clock. On CUDA each step's peak is
``max_memory_allocated`` after ``reset_peak_memory_stats`` minus the memory allocated before it (the memory the step
adds on top of model, gradients' buffers and optimizer state); on the CPU, run with ``MALLOC_MMAP_THRESHOLD_=65536``
(every tensor over 64 KiB its own mapping, returned when freed), it is the resident set's peak over the step
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the resident set before it. The head's share
of the step's FLOPs is ``6 V h D`` over the step's FLOPs (below).
Model-FLOP utilisation: ``6 N D + 12 L h s D`` FLOPs per step (N parameters outside the input embeddings, D tokens,
L layers, h hidden size, s sequence length: PaLM's appendix B, no credit for recomputation) over the step time and the
device's dense bf16 peak (``--peak-tflops``; known for H100 / H200 / A100 by name).

    python benchmarks/bench_decoder_step.py                         # on a GPU (also run by gpu_check.py)
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/bench_decoder_step.py --no-bf16 --hidden 256 --seq-len 256 \
        --batch-size 2 --layers 2 --rounds 5 --chunk-sizes   # vocabulary 128k on a CPU (head share 95 %)
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
from baselines import CheckpointedChunkedLossTrainer, LinearCrossEntropyTrainer
from bench_trainer_step import step
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

RESULTS = Path(__file__).with_name("results")
DOMAINS = ["news", "code", "web"]
#: dense bf16 peak FLOP/s by device name (NVIDIA's data sheets; SXM parts)
PEAK_BF16 = {"H200": 989.4e12, "H100 PCIe": 756.0e12, "H100": 989.4e12, "A100": 312.0e12}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk-sizes", type=int, nargs="*", default=[128, 512, 2048, 8192])
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--skip", nargs="*", default=[], help="configurations left out (plain always runs)")
    parser.add_argument("--intermediate", type=int, help="the MLP's width (default: 4 x hidden)")
    parser.add_argument("--checkpointed-chunk", type=int, default=2048)
    parser.add_argument("--no-bf16", action="store_true", help="fp32 (the default trains under bf16 autocast)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak (default: by device name)")
    parser.add_argument("--results", help="output path without extension (default: print only)")
    return parser.parse_args(argv)


def llama(cli: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=cli.vocab,
        hidden_size=cli.hidden,
        intermediate_size=cli.intermediate or cli.hidden * 4,
        num_hidden_layers=cli.layers,
        num_attention_heads=max(1, cli.hidden // 128),
        num_key_value_heads=max(1, cli.hidden // 256),
        max_position_embeddings=cli.seq_len,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def configs(cli: argparse.Namespace) -> list[str]:
    chunks = [f"minimax-chunk{n}" for n in cli.chunk_sizes]
    torch_op = ["torch-lce-mean"] if hasattr(torch.nn, "LinearCrossEntropyOptions") else []
    fixed = ["plain", f"checkpointed{cli.checkpointed_chunk}", *torch_op, "minimax-full"]
    names = [*fixed, "minimax-default", "minimax-simultaneous", *chunks]
    return [name for name in names if name == "plain" or name not in cli.skip]


def make_trainers(model: LlamaForCausalLM, cli: argparse.Namespace, out: str) -> dict[str, Trainer]:
    """One trainer per configuration around the same model and optimizer (see the module docstring)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    common = dict(
        output_dir=out, report_to=[], use_cpu=not cuda, bf16=not cli.no_bf16, disable_tqdm=True, save_strategy="no"
    )
    trainers: dict[str, Trainer] = {}
    for config in configs(cli):
        if config == "plain":
            trainers[config] = Trainer(model=model, args=TrainingArguments(**common), optimizers=(optimizer, None))
        elif config.startswith("checkpointed"):
            chunk = int(config.removeprefix("checkpointed"))
            args = TrainingArguments(**common)
            trainers[config] = CheckpointedChunkedLossTrainer(
                model=model, args=args, optimizers=(optimizer, None), chunk=chunk
            )
        elif config == "torch-lce-mean":
            args = TrainingArguments(**common)
            trainers[config] = LinearCrossEntropyTrainer(model=model, args=args, optimizers=(optimizer, None))
        else:
            named = {"minimax-full": 0, "minimax-default": None, "minimax-simultaneous": None}  # None: from the shapes
            chunk = named[config] if config in named else int(config.removeprefix("minimax-chunk"))
            order = "simultaneous" if config == "minimax-simultaneous" else "alternating"
            args = MinimaxTrainingArguments(
                **common, task_names=DOMAINS, weighting="minimax", causal_lm_chunk_size=chunk, weight_update=order
            )
            trainers[config] = MinimaxTrainer(model=model, args=args, optimizers=(optimizer, None))
    for trainer in trainers.values():
        trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    # as Trainer.train() does: Accelerate wraps the (shared) model's forward in its autocast
    trainers["plain"].accelerator.prepare_model(model)
    return trainers


def make_batches(n: int, cli: argparse.Namespace) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, cli.vocab, (cli.batch_size, cli.seq_len), generator=g)
        task_ids = (torch.arange(cli.batch_size) % len(DOMAINS))[:, None].expand(-1, cli.seq_len).contiguous()
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids, "task_ids": task_ids})
    return batches


def flops_per_step(model: LlamaForCausalLM, cli: argparse.Namespace) -> float:
    """``6 N D + 12 L h s D`` (see the module docstring; D: the step's tokens, all micro-batches)."""
    embeddings = model.get_input_embeddings().weight.numel()
    parameters = sum(p.numel() for p in model.parameters()) - embeddings
    tokens = cli.batch_size * cli.seq_len * cli.accumulation
    return 6 * parameters * tokens + 12 * cli.layers * cli.hidden * cli.seq_len * tokens


def head_share(model: LlamaForCausalLM, cli: argparse.Namespace) -> float:
    """The output layer's share of the step's FLOPs: ``6 V h D`` over :func:`flops_per_step`."""
    tokens = cli.batch_size * cli.seq_len * cli.accumulation
    return 6 * cli.vocab * cli.hidden * tokens / flops_per_step(model, cli)


def resident_mb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process (MiB)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) / 1024


def peak_flops(cli: argparse.Namespace) -> float | None:
    if cli.peak_tflops:
        return cli.peak_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def run(cli: argparse.Namespace) -> tuple[list[dict], dict]:
    """Interleaved rounds; one row per configuration, and the setup."""
    cuda = torch.cuda.is_available()
    names = configs(cli)
    times: dict[str, list[float]] = {c: [] for c in names}
    cpu_times: dict[str, list[float]] = {c: [] for c in names}
    peaks: dict[str, list[float]] = {c: [] for c in names}
    with tempfile.TemporaryDirectory() as out:
        model = llama(cli)
        trainers = make_trainers(model, cli, out)
        device = trainers["plain"].args.device
        batches = make_batches((cli.rounds + cli.warmup) * cli.accumulation, cli)
        cpu_memory = not cuda and "MALLOC_MMAP_THRESHOLD_" in os.environ
        for i in range(cli.rounds + cli.warmup):
            micro_batches = batches[i * cli.accumulation : (i + 1) * cli.accumulation]
            for config in names if i % 2 == 0 else names[::-1]:
                on_device = [{k: v.to(device) for k, v in batch.items()} for batch in micro_batches]
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                elif cpu_memory:
                    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
                    before = resident_mb("VmRSS")
                start, cpu_start = time.perf_counter(), time.process_time()
                step(trainers[config], on_device, not config.startswith("minimax"))
                if i >= cli.warmup:
                    times[config].append(time.perf_counter() - start)
                    cpu_times[config].append(time.process_time() - cpu_start)
                    if cuda:
                        peaks[config].append((torch.cuda.max_memory_allocated() - before) / 2**20)
                    elif cpu_memory:
                        peaks[config].append(resident_mb("VmHWM") - before)
            print(f"round {i}: " + ", ".join(f"{c} {times[c][-1]:.3f}s" for c in names if times[c]), flush=True)
        flops, peak, share = flops_per_step(model, cli), peak_flops(cli), head_share(model, cli)
    rows = []
    for config in names:
        ratios = [t / p for t, p in zip(times[config], times["plain"], strict=True)]
        seconds = statistics.median(times[config])
        row = {
            "config": config,
            "median_step_s": round(seconds, 4),
            "time_ratio_to_plain": round(statistics.median(ratios), 3),
            "time_ratios_per_round": [round(r, 3) for r in ratios],
            "model_tflops_per_s": round(flops / seconds / 1e12, 1),
            "mfu": None if peak is None else round(flops / seconds / peak, 3),
            "head_share": round(share, 3),
            "accumulation": cli.accumulation,
        }
        if not cuda:
            cpu_ratios = [t / p for t, p in zip(cpu_times[config], cpu_times["plain"], strict=True)]
            row |= {
                "cpu_time_ratio_to_plain": round(statistics.median(cpu_ratios), 3),
                "cpu_time_ratios_per_round": [round(r, 3) for r in cpu_ratios],
            }
        if peaks[config]:
            memory = statistics.median(peaks[config])
            plain = statistics.median(peaks["plain"])
            row |= {"step_peak_mb": round(memory, 1), "memory_ratio_to_plain": round(memory / plain, 3)}
        rows.append(row)
    setup = {
        **{k: v for k, v in vars(cli).items() if k != "results"},
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "flops_per_step": flops,
        "head_share": share,
        "memory": "cuda max_memory_allocated" if cuda else ("VmHWM - VmRSS" if peaks["plain"] else None),
        "peak_flops": peak,
        "torch": torch.__version__,
    }
    return rows, setup


def table(rows: list[dict]) -> list[str]:
    memory, cpu = "step_peak_mb" in rows[0], "cpu_time_ratio_to_plain" in rows[0]
    lines = [
        "| config | head share | accumulation | median step (s) | time / plain (median of rounds) | "
        + ("CPU time / plain (median; range over rounds) | " if cpu else "")
        + "model TFLOP/s | MFU |"
        + (" step peak (MB) | memory / plain |" if memory else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if cpu else "") + ("---|---|" if memory else ""),
    ]
    for r in rows:
        line = f"| {r['config']} | {r['head_share']:.0%} | {r['accumulation']} | {r['median_step_s']} | "
        line += f"{r['time_ratio_to_plain']} | "
        if cpu:
            spread = r["cpu_time_ratios_per_round"]
            line += f"{r['cpu_time_ratio_to_plain']} ({min(spread)}–{max(spread)}) | "
        line += f"{r['model_tflops_per_s']} | {'n/a' if r['mfu'] is None else r['mfu']} |"
        if memory:
            line += f" {r['step_peak_mb']} | {r['memory_ratio_to_plain']} |"
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> None:
    cli = parse(argv)
    rows, setup = run(cli)
    print("\n".join(table(rows)))
    if cli.results:
        stem = Path(cli.results)
        command = " ".join(["python", *sys.argv])
        stem.with_suffix(".json").write_text(
            json.dumps({"command": command, "setup": setup, "results": rows}, indent=1)
        )
        text = [f"# Decoder step: {setup['device']}", "", f"Command: `{command}`", "", *table(rows), ""]
        stem.with_suffix(".md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
