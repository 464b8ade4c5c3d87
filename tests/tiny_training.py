"""A tiny BERT masked-LM run used by the trainer tests, in-process or as a script (torchrun, resume-after-kill).

As a script it writes, into ``--out``: ``grads-rank<r>.safetensors`` (the first step's gradients, before the optimizer
step), ``weights-rank<r>.json`` (the weights of every step) and the Trainer's checkpoints; with ``--eval_examples N``
it only evaluates (a ``labels`` + ``task_ids`` model and a ``task_losses`` model) and writes ``eval-rank<r>.json``.
Every training run also writes ``run-rank<r>.json`` (Accelerate's distributed type, the wrapped model's class, whether
the parameters are DTensor shards) and, on the main process, the final model into ``final/``.

``--fsdp2`` trains under Accelerate's FSDP2 path on CPU, which Accelerate itself never selects there (on CPU it runs
DDP, even with an FSDP config): after the trainer is built with the ordinary 2-process CPU state, the distributed type
of Accelerate's shared states is set to FSDP with an FSDP2 plugin (BertLayer auto-wrap, sharded state dict), so
``Trainer.train`` shards the model with Accelerate's ``fsdp2_prepare_model`` (torch ``fully_shard``) and saves sharded
checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from datasets import Dataset
from safetensors.torch import save_file
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor
from transformers import BertConfig, BertForMaskedLM, TrainerCallback

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

TASKS = ["verb", "noun", "adjective"]
VOCAB, SEQ = 64, 16


def tiny_bert(seed: int = 0, dropout: float = 0.0, untie_mlm_bias: bool = False) -> BertForMaskedLM:
    """A 2-layer BERT masked LM. ``untie_mlm_bias`` gives the decoder its own copy of the output bias (Accelerate's
    FSDP2 wrapping refuses the parameter that ``cls.predictions.bias`` and ``cls.predictions.decoder.bias`` share)."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    model = BertForMaskedLM(config)
    if untie_mlm_bias:
        head = model.cls.predictions
        head.decoder.bias = torch.nn.Parameter(head.bias.detach().clone())
        head.bias.requires_grad_(False)  # unused now; a trainable parameter without gradients breaks FSDP2 resume
    return model


def force_fsdp2(trainer: MinimaxTrainer, layer: str = "BertLayer") -> None:
    """Switch the trainer's (CPU, multi-process) Accelerate state to FSDP2 before ``train`` prepares the model
    (``fully_shard`` per ``layer``, plus the root)."""
    state = trainer.accelerator.state
    state.distributed_type = PartialState().distributed_type = DistributedType.FSDP  # both shared states
    state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[layer],
        state_dict_type="SHARDED_STATE_DICT",
        reshard_after_forward=True,
    )
    trainer.is_fsdp_enabled = True


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (gathered from every process if it is a DTensor shard)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def masked_examples(n: int, seed: int = 0, num_tasks: int = len(TASKS)) -> dict[str, torch.Tensor]:
    """Pre-masked examples: ~30% targets, each with a random task id (task 0 three times as frequent)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    is_target = torch.rand(n, SEQ, generator=g) < 0.3
    labels = torch.where(is_target, input_ids, -100)
    probs = torch.tensor([3.0] + [1.0] * (num_tasks - 1))
    task_ids = torch.multinomial(probs, n * SEQ, replacement=True, generator=g).view(n, SEQ)
    return {
        "input_ids": torch.where(is_target, 4, input_ids),  # 4 plays [MASK]
        "attention_mask": torch.ones(n, SEQ, dtype=torch.long),
        "labels": labels,
        "task_ids": torch.where(is_target, task_ids, -100),
    }


def as_dataset(examples: dict[str, torch.Tensor]) -> Dataset:
    return Dataset.from_dict({k: v.tolist() for k, v in examples.items()})


class TaskLossBert(torch.nn.Module):
    """``tiny_bert`` returning ``task_losses`` and ``task_counts`` dicts (the contract of the vision models).

    Its batches carry the task ids as ``target_task_ids``, so the trainer takes the losses from the model.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bert = tiny_bert()

    def forward(self, input_ids, attention_mask, labels, target_task_ids) -> dict:
        logits = self.bert(input_ids=input_ids, attention_mask=attention_mask).logits
        mask = target_task_ids >= 0
        losses = torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="none")
        ids = target_task_ids[mask]
        present = [(name, ids == t) for t, name in enumerate(TASKS) if (ids == t).any()]
        return {
            "task_losses": {name: losses[of_task].mean() for name, of_task in present},
            "task_counts": {name: float(of_task.sum()) for name, of_task in present},
        }


def one_step_args(output_dir: str, task_names: list[str], **overrides) -> MinimaxTrainingArguments:
    """Arguments of a one-step CPU run that logs every step and saves nothing; ``overrides`` replace any of them."""
    options = dict(
        output_dir=output_dir,
        task_names=task_names,
        per_device_train_batch_size=8,
        max_steps=1,
        learning_rate=1e-3,
        max_grad_norm=0.0,
        report_to=[],
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
    )
    options.update(overrides)
    return MinimaxTrainingArguments(**options)


def evaluate_both_modes(args: MinimaxTrainingArguments, num_examples: int) -> dict[str, dict[str, float]]:
    """Evaluation metrics of the same examples through ``labels`` + ``task_ids`` and through ``task_losses``."""
    examples = masked_examples(num_examples, seed=1)
    renamed = {("target_task_ids" if k == "task_ids" else k): v for k, v in examples.items()}
    metrics = {}
    for mode, model, data in (("labels", tiny_bert(), examples), ("task_losses", TaskLossBert(), renamed)):
        metrics[mode] = MinimaxTrainer(model=model, args=args, eval_dataset=as_dataset(data)).evaluate()
    return metrics


class RecordCallback(TrainerCallback):
    """Records the first step's gradients and every step's weights; optionally SIGKILLs itself after a save."""

    def __init__(self, trainer: MinimaxTrainer, out: str, kill_after_save: int | None = None) -> None:
        self.trainer, self.out, self.kill_after_save = trainer, out, kill_after_save
        self.grads: dict[str, torch.Tensor] | None = None
        self.weights: list[list[float]] = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.grads is None:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            self.grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        self.weights.append(self.trainer.step_weights.tolist())

    def on_save(self, args, state, control, **kwargs):
        if self.kill_after_save is not None and state.global_step == self.kill_after_save:
            if torch.distributed.is_initialized():  # every process has written its part of the checkpoint
                torch.distributed.barrier()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--num_examples", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--grad_accum", type=int, default=1)
    parser.add_argument("--max_steps", type=int, default=1)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--weighting", default="minimax")
    parser.add_argument("--loss_ema", type=float, default=0.0)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--reference_model", help="excess loss over this frozen reference model")
    parser.add_argument("--kill_after_save", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--eval_examples", type=int, default=0)
    parser.add_argument("--fsdp2", action="store_true")
    parser.add_argument("--untie_mlm_bias", action="store_true")
    parser.add_argument("--logging_steps", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--gpu", action="store_true", help="train on CUDA devices (default: CPU)")
    parser.add_argument("--compile_backend", help="train with torch_compile=True and this torch_compile_backend")
    cli = parser.parse_args()
    args = MinimaxTrainingArguments(
        output_dir=cli.out,
        task_names=TASKS,
        weighting=cli.weighting,
        loss_ema=cli.loss_ema,
        **({"alpha": cli.alpha} if cli.weighting == "minimax" else {}),
        **({"loss_normalization": "excess", "reference_model": cli.reference_model} if cli.reference_model else {}),
        per_device_train_batch_size=cli.batch_size,
        per_device_eval_batch_size=cli.batch_size,
        gradient_accumulation_steps=cli.grad_accum,
        max_steps=cli.max_steps,
        learning_rate=cli.learning_rate,
        max_grad_norm=0.0,
        logging_steps=cli.logging_steps,
        save_strategy="steps" if cli.save_steps else "no",
        save_steps=cli.save_steps or 500,
        torch_compile=cli.compile_backend is not None,
        torch_compile_backend=cli.compile_backend,
        report_to=[],
        use_cpu=not cli.gpu,
        seed=7,
        data_seed=7,
        disable_tqdm=True,
    )
    os.makedirs(cli.out, exist_ok=True)  # also where this process is not the main one (another node's folder)
    if cli.eval_examples:
        with open(os.path.join(cli.out, f"eval-rank{args.process_index}.json"), "w") as f:
            json.dump(evaluate_both_modes(args, cli.eval_examples), f)
        return
    trainer = MinimaxTrainer(
        model=tiny_bert(dropout=cli.dropout, untie_mlm_bias=cli.untie_mlm_bias),
        args=args,
        train_dataset=as_dataset(masked_examples(cli.num_examples)),
    )
    if cli.fsdp2:
        force_fsdp2(trainer)
    record = RecordCallback(trainer, cli.out, cli.kill_after_save)
    trainer.add_callback(record)
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    rank = args.process_index
    grads = {k: v.contiguous() for k, v in record.grads.items()}
    save_file(grads, os.path.join(cli.out, f"grads-rank{rank}.safetensors"))
    with open(os.path.join(cli.out, f"weights-rank{rank}.json"), "w") as f:
        json.dump(record.weights, f)
    run = {
        "distributed_type": trainer.accelerator.distributed_type.value,
        "wrapped_model": type(trainer.model_wrapped).__name__,
        "dtensor_parameters": all(isinstance(p, DTensor) for p in trainer.model.parameters()),
        "log_history": trainer.state.log_history,
        "compiled_graphs": int(counters["stats"]["unique_graphs"]),  # first compilations + recompilations
        "graph_breaks": int(counters["graph_break"].total()),
    }
    with open(os.path.join(cli.out, f"run-rank{rank}.json"), "w") as f:
        json.dump(run, f)
    trainer.save_model(os.path.join(cli.out, "final"))  # every process: gathering FSDP shards is collective
    if cli.fsdp2:  # what a checkpoint save does (sharded: no model file) into a folder that does not exist yet
        trainer.save_model(os.path.join(cli.out, "sharded-save"), _internal_call=True)


if __name__ == "__main__":
    main()
