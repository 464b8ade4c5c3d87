"""The GPU check in one command: what this CPU-only repository cannot measure, on one CUDA machine, offline.

    python benchmarks/gpu_check.py              # on a CUDA machine: writes benchmarks/results/gpu_check.{md,json}
    python benchmarks/gpu_check.py --dry-run    # on the CPU, tiny sizes, the same code paths (CI runs this)

Parts, each recorded with its outcome (``ok`` / ``failed`` with the error) and wall time, run most telling first
(6, 4, 2, 3, 5, 1) with the report rewritten after each, so a run cut off by a time limit keeps what it measured:

1. ``gpu_tests``: the test suite's GPU-only tests (the ``test_gpu_*`` functions outside ``tests/test_gpu_check.py``,
   whose CPU dry run of this script is not re-run; one needing more GPUs than present skips). Dry run: collected only.
2. ``autocast``: 3 MinimaxTrainer steps of a tiny BERT with ``bf16`` and with ``fp16``: whether Accelerate autocast,
   the logits' (fp32: Accelerate converts the outputs), a matmul's inside the model and the task sums' dtypes,
   finite per-task losses, weights summing to 1. On the CPU fp16 runs in fp32 (Accelerate does not autocast it
   there), which the record says.
3. ``compile``: 3 steps with ``torch_compile=True`` (backend ``inductor``; dry run ``eager``), compared with the same
   steps eager (largest absolute parameter difference).
4. ``sync_count``: one optimizer step (accumulation 2) of the plain sparse-head Trainer and of MinimaxTrainer
   (minimax, proportional) on a tiny BERT, and of the plain Trainer and MinimaxTrainer (minimax, chunked loss) on a
   tiny Llama, counted by ``tests/sync_counting.py`` (device-syncing aten ops and host transfers of device tensors)
   and, on CUDA, by ``torch.cuda``'s sync debug mode (the syncs the driver actually performed). Budget (tested on
   the CPU count): MinimaxTrainer's step within the plain one's + 2, the two host transfers of the weighting.
5. ``step_benchmark``: ``bench_trainer_step.py``'s interleaved step timing, plain full-logits and plain sparse-head
   Trainers against MinimaxTrainer (minimax, proportional, average), in fp32 (TF32 where the image's cuBLAS allows
   it: the report's ``fp32_matmuls_in_tf32``), with peak CUDA memory and model-FLOP utilisation against the dense bf16
   peak; two sizes on CUDA (the 4-layer BERT of the CPU results, launch-bound on a GPU, and BERT-base at
   sequence 512).
6. ``decoder_step``: ``bench_decoder_step.py`` at a Llama-3-like head (vocabulary 128,256, hidden 2,048, bf16):
   4 layers x 4 x 2,048 tokens (accumulation 1, and 4 micro-batches of 2,048) and 16 layers x 2 x 2,048 tokens (a
   1B-like shape); the plain Trainer, a checkpointed chunked loss, PyTorch's ``F.linear_cross_entropy`` (chunked,
   ``mean``), MinimaxTrainer with the full logits, with the sliced loss under the alternating and the simultaneous
   order (single pass); head share of the FLOPs, time ratio per round, step peak memory, MFU on every row.

Budget: about 8 minutes on one H100. Nothing is downloaded (models are built from configs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(REPO_ROOT / "tests")]

import bench_decoder_step  # noqa: E402
import bench_trainer_step  # noqa: E402
from baselines import SparsePredictionBertForMaskedLM  # noqa: E402
from sync_counting import count_step_syncs  # noqa: E402
from tiny_causal_lm import DOMAINS, domain_examples, tiny_llama  # noqa: E402
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments  # noqa: E402

RESULTS = HERE / "results"
#: the message of torch.cuda's sync debug mode (set_sync_debug_mode("warn"))
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


def tiny_args(output_dir: str, cuda: bool, **overrides: Any) -> MinimaxTrainingArguments:
    options = dict(
        output_dir=output_dir,
        task_names=TASKS,
        per_device_train_batch_size=4,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not cuda,
        seed=7,
        disable_tqdm=True,
    )
    options.update(overrides)
    return MinimaxTrainingArguments(**options)


def autocast(precision: str, cuda: bool, out: str) -> dict:
    trainer = MinimaxTrainer(
        model=tiny_bert(),
        args=tiny_args(out, cuda, **{precision: True}),
        train_dataset=as_dataset(masked_examples(16)),
    )
    dtypes, matmuls = set(), set()
    task_sums = trainer._task_sums

    def record(model, inputs):
        sums, counts, outputs = task_sums(model, inputs)
        dtypes.add((str(outputs["logits"].dtype), str(sums.dtype)))
        return sums, counts, outputs

    trainer._task_sums = record
    # Accelerate returns the outputs in fp32 (convert_outputs_to_fp32): a matmul inside the model shows the autocast
    inner = trainer.model.bert.encoder.layer[0].intermediate.dense
    inner.register_forward_hook(lambda module, args, output: matmuls.add(str(output.dtype)))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    losses = [entry[f"task_loss/{task}"] for entry in logs for task in TASKS if f"task_loss/{task}" in entry]
    return {
        "autocast": bool(trainer.accelerator.native_amp),
        "logits_and_task_sums_dtypes": sorted(dtypes),
        "matmul_dtypes_inside_the_model": sorted(matmuls),
        "task_losses_finite": bool(torch.isfinite(torch.tensor(losses)).all()),
        "weights_sum": round(float(trainer.step_weights.sum()), 6),
        "last_loss": logs[-1]["loss"],
    }


def compile_check(cuda: bool, out: str) -> dict:
    backend = "inductor" if cuda else "eager"
    models = {}
    for compiled in (True, False):
        model = tiny_bert()
        args = tiny_args(
            f"{out}/{compiled}", cuda, torch_compile=compiled, torch_compile_backend=backend if compiled else None
        )
        MinimaxTrainer(model=model, args=args, train_dataset=as_dataset(masked_examples(16))).train()
        models[compiled] = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    difference = max(float((models[True][k] - models[False][k]).abs().max()) for k in models[False])
    return {"backend": backend, "steps": 3, "max_abs_parameter_difference_vs_eager": difference}


def sync_counts(cuda: bool, out: str) -> dict:
    step = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=2,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=not cuda,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=100,
    )
    trainers: dict[str, Callable[[], Trainer]] = {
        "plain-sparse-head": lambda: Trainer(
            model=SparsePredictionBertForMaskedLM(tiny_bert().config),
            args=TrainingArguments(output_dir=f"{out}/plain", **step),
            train_dataset=as_dataset(masked_examples(16)),
        ),
        **{
            weighting: (
                lambda weighting=weighting: MinimaxTrainer(
                    model=tiny_bert(),
                    args=MinimaxTrainingArguments(
                        output_dir=f"{out}/{weighting}", task_names=TASKS, weighting=weighting, **step
                    ),
                    train_dataset=as_dataset(masked_examples(16)),
                )
            )
            for weighting in ("minimax", "proportional")
        },
        "plain-causal-lm": lambda: Trainer(
            model=tiny_llama(),
            args=TrainingArguments(output_dir=f"{out}/plain-lm", **step),
            train_dataset=as_dataset({k: v for k, v in domain_examples(16).items() if k != "task_ids"}),
        ),
        "minimax-causal-lm": lambda: MinimaxTrainer(
            model=tiny_llama(),
            args=MinimaxTrainingArguments(output_dir=f"{out}/minimax-lm", task_names=DOMAINS, **step),
            train_dataset=as_dataset(domain_examples(16)),
        ),
    }
    results = {}
    for name, build in trainers.items():
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            counter = count_step_syncs(build(), cuda_sync_debug=cuda)
        result = {"counted_ops": counter.total, "by_op": dict(counter.counts)}
        if cuda:
            result["cuda_sync_debug_mode"] = sum(CUDA_SYNC_WARNING in str(w.message) for w in caught)
        results[name] = result
    return results


def step_benchmark(cuda: bool, out: str, dry_run: bool) -> dict:
    sizes = (
        [dict(layers=1, hidden=32, seq_len=16, batch_size=2, rounds=2, warmup=1)]
        if dry_run
        else [
            dict(layers=4, hidden=256, seq_len=128, batch_size=16, rounds=20, warmup=5),
            dict(layers=12, hidden=768, seq_len=512, batch_size=32, rounds=10, warmup=3),
        ]
    )
    results = []
    for size in sizes:
        cli = argparse.Namespace(
            **size,
            threads=torch.get_num_threads(),
            configs=["minimax", "proportional", "average"],
            no_memory=dry_run,
            results=None,
        )
        rows, setup = bench_trainer_step.run(cli)
        flops = bert_flops_per_step(size)
        peak = bench_decoder_step.peak_flops(argparse.Namespace(peak_tflops=None))
        for row in rows:
            row["model_tflops_per_s"] = round(flops / row["median_step_s"] / 1e12, 2)
            row["mfu"] = None if peak is None else round(flops / row["median_step_s"] / peak, 4)
        results.append({"setup": {**setup, "flops_per_step": flops, "peak_flops": peak}, "results": rows})
    return {"runs": results}


def bert_flops_per_step(size: dict) -> float:
    """``6 N D + 12 L h s D`` for the step benchmark's BERT (as ``bench_decoder_step.flops_per_step``)."""
    model = transformers.BertForMaskedLM(
        bench_trainer_step.bert_config(size["layers"], size["hidden"], size["seq_len"])
    )
    embeddings = sum(p.numel() for p in model.bert.embeddings.parameters())
    parameters = sum(p.numel() for p in model.parameters()) - embeddings
    tokens = size["batch_size"] * size["seq_len"]
    return 6 * parameters * tokens + 12 * size["layers"] * size["hidden"] * size["seq_len"] * tokens


#: the decoder shapes timed on a GPU: the default (4 layers x 2,048, head share 0.48 by
#: ``bench_decoder_step.head_share``) at accumulation 1 and 4, and a 1B-like model (16 layers x 2,048, head share
#: 0.19); every run has the alternating and the simultaneous order (rows ``minimax-default`` / ``minimax-simultaneous``)
DECODER_SHAPES = (
    "--rounds 6 --warmup 2 --chunk-sizes 512",
    "--rounds 6 --warmup 2 --chunk-sizes 512 --batch-size 1 --accumulation 4",
    "--layers 16 --batch-size 2 --rounds 5 --warmup 2 --chunk-sizes",
)
#: the same code paths at tiny sizes (dry run)
TINY_DECODER = "--vocab 512 --hidden 64 --seq-len 32 --batch-size 2 --rounds 2 --warmup 1 --checkpointed-chunk 16"
TINY_DECODER_SHAPES = ("--layers 1 --chunk-sizes 4 64", "--layers 2 --chunk-sizes --accumulation 2")


def decoder_step(dry_run: bool) -> dict:
    runs = []
    for shape in TINY_DECODER_SHAPES if dry_run else DECODER_SHAPES:
        cli = bench_decoder_step.parse(f"{TINY_DECODER} {shape}".split() if dry_run else shape.split())
        rows, setup = bench_decoder_step.run(cli)
        runs.append({"setup": setup, "results": rows})
    return {"runs": runs}


def gpu_tests(dry_run: bool) -> dict:
    files = sorted(
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / "tests").glob("test_*.py")
        if "def test_gpu_" in p.read_text() and p.name != "test_gpu_check.py"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "test_gpu_", *files]
    if dry_run:
        command.append("--collect-only")
    path = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        command, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=420
    )
    if result.returncode not in (0, 5):  # 5: nothing selected
        raise RuntimeError(f"pytest exited {result.returncode}: {result.stdout[-2000:]}{result.stderr[-1000:]}")
    return {"command": " ".join(command[1:]), "summary": result.stdout.strip().splitlines()[-1:]}


def timed(name: str, part: Callable[[], Any]) -> dict:
    started = time.perf_counter()
    try:
        record = {"part": name, "status": "ok", "result": part()}
    except Exception as error:  # a failed part is a finding: record it and go on with the others
        record = {"part": name, "status": "failed", "error": f"{type(error).__name__}: {error}"}
        traceback.print_exc()
    record["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{name}: {record['status']} ({record['seconds']} s)", flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny sizes (checks the script itself)")
    parser.add_argument(
        "--results",
        help="output path without extension (default: benchmarks/results/gpu_check; "
        "dry run: gpu_check_dry_run in the temporary directory)",
    )
    cli = parser.parse_args()
    cuda = torch.cuda.is_available() and not cli.dry_run
    if not cuda and not cli.dry_run:
        print("gpu_check: no CUDA device here; run it on a CUDA machine, or with --dry-run on the CPU", file=sys.stderr)
        sys.exit(2)
    default = RESULTS / "gpu_check" if cuda else Path(tempfile.gettempdir()) / "gpu_check_dry_run"
    stem = Path(cli.results) if cli.results else default
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        checks: dict[str, Callable[[], Any]] = {
            "decoder_step": lambda: decoder_step(cli.dry_run),
            "sync_count": lambda: sync_counts(cuda, f"{out}/sync"),
            "autocast_bf16": lambda: autocast("bf16", cuda, f"{out}/bf16"),
            "autocast_fp16": lambda: autocast("fp16", cuda, f"{out}/fp16"),
            "compile": lambda: compile_check(cuda, f"{out}/compile"),
            "step_benchmark": lambda: step_benchmark(cuda, f"{out}/bench", cli.dry_run),
            "gpu_tests": lambda: gpu_tests(cli.dry_run),
        }
        parts: list[dict] = []
        for name, check in checks.items():  # the report is rewritten after each part: a cut-off run keeps its parts
            parts.append(timed(name, check))
            write_report(stem, parts, cuda, started)
    print(f"wrote {stem}.md and {stem}.json")
    sys.exit(0 if all(part["status"] == "ok" for part in parts) else 1)


def write_report(stem: Path, parts: list[dict], cuda: bool, started: float) -> None:
    report = {
        "command": " ".join(["python", *sys.argv]),
        "mode": "cuda" if cuda else "dry run (CPU, tiny sizes: not GPU figures)",
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "fp32_matmuls_in_tf32": torch.backends.cuda.matmul.allow_tf32
        or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1",
        "total_seconds": round(time.perf_counter() - started, 1),
        "parts": parts,
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    lines = [
        f"# GPU check ({report['mode']})",
        "",
        f"Command: `{report['command']}`; device {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
        f"transformers {report['transformers']}; {report['total_seconds']} s in all.",
        "",
        "| part | status | seconds |",
        "|---|---|---|",
        *(f"| {p['part']} | {p['status']} | {p['seconds']} |" for p in report["parts"]),
        "",
    ]
    for part in report["parts"]:
        lines += [f"## {part['part']}", ""]
        if part["status"] != "ok":
            lines += [f"Failed: `{part['error']}`", ""]
        elif part["part"] == "step_benchmark":
            for run in part["result"]["runs"]:
                lines += [f"Setup: `{json.dumps(run['setup'])}`", ""]
                lines += bench_trainer_step.table(run["results"]) + [""]
                lines += [f"Model-FLOP utilisation: {[(r['config'], r['mfu']) for r in run['results']]}", ""]
        elif part["part"] == "decoder_step":
            for run in part["result"]["runs"]:
                lines += [f"Setup: `{json.dumps(run['setup'])}`", ""]
                lines += bench_decoder_step.table(run["results"]) + [""]
        else:
            lines += ["```json", json.dumps(part["result"], indent=1, default=str), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
