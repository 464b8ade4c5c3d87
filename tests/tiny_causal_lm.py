"""Tiny decoder LMs and domain-tagged sequences for the causal-LM tests, in-process or as a script (torchrun).

As a script it trains ``tiny_llama`` one step with ``MinimaxTrainer`` on ``domain_examples(8)`` and writes, into
``--out``, ``grads-rank<r>.safetensors``: the first step's gradients (averaged over processes, gathered from the shards
under ``--fsdp2``), before the optimizer step, and ``run-rank<r>.json``: how the model was wrapped, whether the chunked
loss ran, the step's per-domain losses; with ``--reference_model`` also every step's per-domain reference losses and
weights, and the reference's parameters: all of them and those held by this process (its shards under FSDP2).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from tiny_training import as_dataset, force_fsdp2, full, one_step_args
from torch.distributed.tensor import DTensor
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Trainer,
    TrainerCallback,
)

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments

DOMAINS = ["news", "code", "web"]
VOCAB, SEQ = 128, 16


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return GPT2LMHeadModel(config)


#: the size of the tiny Llama-style decoders (Llama, Qwen2): grouped-query attention with one key/value head
LLAMA_STYLE_SIZE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=SEQ,
)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(**LLAMA_STYLE_SIZE)
    return LlamaForCausalLM(config)


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(**LLAMA_STYLE_SIZE)
    return Qwen2ForCausalLM(config)


def domain_examples(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``n`` sequences, each of one domain (example-level ``task_ids``), every other one right-padded.

    Domain 0 repeats a short cycle of tokens (easy to predict), domain 1 draws from a quarter of the vocabulary,
    domain 2 from all of it (hardest). Padding has attention mask 0 and label -100.
    """
    g = torch.Generator().manual_seed(seed)
    task_ids = torch.arange(n) % len(DOMAINS)
    start = torch.randint(1, VOCAB - 4, (n, 1), generator=g)
    cycle = start + torch.arange(SEQ) % 4
    narrow = torch.randint(1, VOCAB // 4, (n, SEQ), generator=g)
    wide = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    input_ids = torch.where(task_ids[:, None] == 0, cycle, torch.where(task_ids[:, None] == 1, narrow, wide))
    lengths = torch.where(torch.arange(n) % 2 == 1, torch.randint(3, SEQ, (n,), generator=g), SEQ)
    attention_mask = (torch.arange(SEQ) < lengths[:, None]).long()
    return {
        "input_ids": torch.where(attention_mask.bool(), input_ids, 0),
        "attention_mask": attention_mask,
        "labels": torch.where(attention_mask.bool(), input_ids, -100),
        "task_ids": task_ids,
    }


def make_args(output_dir: str, **overrides) -> MinimaxTrainingArguments:
    return one_step_args(output_dir, overrides.pop("task_names", DOMAINS), **overrides)


class GradRecorder(TrainerCallback):
    """The first optimizer step's gradients (after the DDP all-reduce), by parameter name of the unwrapped model."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.grads: dict[str, torch.Tensor] | None = None
        trainer.add_callback(self)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.grads is None:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            self.grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}


def minimax_grads(model: PreTrainedModel, args: MinimaxTrainingArguments, examples: dict) -> dict[str, torch.Tensor]:
    trainer = MinimaxTrainer(model=model, args=args, train_dataset=as_dataset(examples))
    recorder = GradRecorder(trainer)
    trainer.train()
    return recorder.grads


class ReferenceRecorder(TrainerCallback):
    """Every step's per-domain reference losses (as the weighting receives them) and weights, and the reference
    model's parameter counts: in all, and held by this process (the local shards of DTensor parameters)."""

    def __init__(self, trainer: MinimaxTrainer) -> None:
        self.trainer, self.losses, self.weights = trainer, [], []
        weights = trainer.weighting.weights

        def recording(*args, reference_losses, **kwargs):
            self.losses.append(reference_losses.tolist())
            return weights(*args, reference_losses=reference_losses, **kwargs)

        trainer.weighting.weights = recording
        trainer.add_callback(self)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.weights.append(self.trainer.step_weights.tolist())

    def parameters(self) -> dict[str, int]:
        unique = {id(p): p for p in self.trainer.reference.model.parameters()}.values()
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in unique)
        return {"total": sum(p.numel() for p in unique), "local": local}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--grad_accum", type=int, default=1)
    parser.add_argument("--weighting", default="proportional")
    parser.add_argument("--chunk_size", type=int, help="causal_lm_chunk_size (default: the option's default)")
    parser.add_argument("--fsdp2", action="store_true", help="shard with FSDP2 (fully_shard per LlamaDecoderLayer)")
    parser.add_argument("--max_steps", type=int, default=1)
    parser.add_argument("--reference_model", help="the online excess over this reference model (minimax)")
    parser.add_argument("--weight_update", default="alternating")
    cli = parser.parse_args()
    chunking = {} if cli.chunk_size is None else {"causal_lm_chunk_size": cli.chunk_size}
    if cli.reference_model:
        chunking.update(loss_normalization="excess", reference_model=cli.reference_model)
    args = make_args(
        cli.out,
        weighting=cli.weighting,
        **chunking,
        per_device_train_batch_size=cli.batch_size,
        gradient_accumulation_steps=cli.grad_accum,
        max_steps=cli.max_steps,
        weight_update=cli.weight_update,
        data_seed=7,
    )
    examples = domain_examples(8 * cli.max_steps)
    trainer = MinimaxTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(examples))
    if cli.fsdp2:
        force_fsdp2(trainer, "LlamaDecoderLayer")
    recorder = GradRecorder(trainer)
    references = ReferenceRecorder(trainer) if cli.reference_model else None
    trainer.train()
    os.makedirs(cli.out, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in recorder.grads.items()},
        os.path.join(cli.out, f"grads-rank{args.process_index}.safetensors"),
    )
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    run = {
        "wrapped_model": type(trainer.model_wrapped).__name__,
        "chunked_forward_passes": 0 if trainer.lm_loss is None else trainer.lm_loss.forward_passes,
        "single_passes": 0 if trainer.lm_loss is None else trainer.lm_loss.single_passes,
        "task_losses": {name: logged[f"task_loss/{name}"] for name in DOMAINS},
    }
    if references is not None:
        run.update(
            reference_losses=references.losses,
            weights=references.weights,
            reference_parameters=references.parameters(),
            reference_class=type(trainer.reference.model).__name__,
        )
    with open(os.path.join(cli.out, f"run-rank{args.process_index}.json"), "w") as f:
        json.dump(run, f)


if __name__ == "__main__":
    main()
