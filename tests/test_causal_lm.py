"""MinimaxTrainer on decoder LMs: next-token targets shifted as the model's own loss shifts them, domains as tasks
(one per sequence or per token), the plain Trainer's gradient under ``proportional``, per-domain eval perplexity."""

import math
import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model
from ports import free_port
from processes import TESTS, checkout_env
from safetensors.torch import load_file
from test_trainer import max_relative_difference, one_step
from tiny_causal_lm import (
    DOMAINS,
    SEQ,
    GradRecorder,
    as_dataset,
    domain_examples,
    make_args,
    minimax_grads,
    tiny_gpt2,
    tiny_llama,
    tiny_qwen2,
)
from tiny_training import tiny_bert
from transformers import (
    BertConfig,
    BertLMHeadModel,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    Trainer,
    TrainingArguments,
)

from robust_pretrain import MinimaxTrainer
from robust_pretrain.trainer import is_causal_lm

LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]


def next_token_losses(model, examples: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target cross-entropy of the model's logits against ``labels[:, 1:]`` and each target's domain, by hand."""
    logits = model(input_ids=examples["input_ids"], attention_mask=examples["attention_mask"]).logits[:, :-1]
    targets = examples["labels"][:, 1:]
    task_ids = examples["task_ids"]
    domains = task_ids[:, 1:] if task_ids.dim() == 2 else task_ids[:, None].expand_as(targets)
    mask = targets != -100
    return torch.nn.functional.cross_entropy(logits[mask], targets[mask], reduction="none"), domains[mask]


def plain_trainer_grads(tmp_path, make_model, examples, **overrides) -> dict[str, torch.Tensor]:
    """First-step gradients of ``transformers.Trainer`` with the model's own loss (``ForCausalLMLoss``)."""
    args = make_args(str(tmp_path), **overrides)
    plain = TrainingArguments(
        **{k: v for k, v in args.to_dict().items() if k in TrainingArguments.__dataclass_fields__}
    )
    model = make_model()
    # GPT2LMHeadModel has no loss_type, so transformers (5.24) counts num_items_in_batch over unshifted labels:
    # position 0 of every row counted, the loss and gradient under-scaled. Declared, it is counted as for Llama.
    model.loss_type = "ForCausalLM"
    data = as_dataset({k: v for k, v in examples.items() if k != "task_ids"})
    trainer = Trainer(model=model, args=plain, train_dataset=data)
    recorder = GradRecorder(trainer)
    trainer.train()
    return recorder.grads


def assert_two_gloo_processes_give_plain_trainer_grads(tmp_path, *options: str) -> None:
    """``tiny_causal_lm.py`` on 2 gloo processes (2 examples x 2 micro-batches each, then ``options``): each rank's
    first-step gradient is the plain Trainer's on the same 8 examples."""
    out = tmp_path / "ddp"
    command = [*LAUNCH, "--master_port", str(free_port()), str(TESTS / "tiny_causal_lm.py"), "--out", str(out)]
    batches = ["--batch_size", "2", "--grad_accum", "2"]
    subprocess.run([*command, *batches, *options], check=True, env=checkout_env(OMP_NUM_THREADS="1"))
    plain = plain_trainer_grads(tmp_path / "plain", tiny_llama, domain_examples(8))
    for rank in (0, 1):
        assert max_relative_difference(plain, load_file(out / f"grads-rank{rank}.safetensors")) <= 1e-5, rank


class CausalByLossType(torch.nn.Module):
    loss_type = "ForCausalLM"


class LlamaSubclass(LlamaForCausalLM):
    """A class outside the Auto mapping whose base is in it (as FSDP2 and user subclasses make)."""


def bert_decoder():
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, is_decoder=True)
    return BertLMHeadModel(config)


def t5():
    return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))


def lora_llama():
    return get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize(
    ("make_model", "causal"),
    [
        (tiny_gpt2, True),
        (tiny_llama, True),
        (tiny_qwen2, True),
        (bert_decoder, True),
        (lora_llama, True),
        (lambda: LlamaSubclass(tiny_llama().config), True),
        (CausalByLossType, True),
        (tiny_bert, False),
        (t5, False),
    ],
)
def test_causal_lms_are_detected_as_transformers_detects_them(make_model, causal):
    assert is_causal_lm(make_model()) is causal


def test_a_causal_lm_gets_full_logits_and_a_masked_lm_the_target_only_head(tmp_path):
    assert MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path))).mlm_head is None
    assert MinimaxTrainer(model=tiny_bert(), args=make_args(str(tmp_path), task_names=DOMAINS)).mlm_head is not None


@pytest.mark.parametrize("make_model", [tiny_gpt2, tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_proportional_gives_the_plain_trainer_gradient(tmp_path, make_model, accumulation):
    """The plain Trainer's loss is the mean next-token loss over the step's targets (``num_items_in_batch`` counted
    over every micro-batch of the accumulation window); ``proportional`` is the same objective."""
    examples = domain_examples(8)
    options = dict(per_device_train_batch_size=8 // accumulation, gradient_accumulation_steps=accumulation)
    plain = plain_trainer_grads(tmp_path / "plain", make_model, examples, **options)
    args = make_args(str(tmp_path / "p"), weighting="proportional", **options)
    assert max_relative_difference(plain, minimax_grads(make_model(), args, examples)) <= 1e-5


def test_label_smoothing_gives_the_plain_trainer_gradient(tmp_path):
    examples = domain_examples(8)
    options = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, label_smoothing_factor=0.1)
    plain = plain_trainer_grads(tmp_path / "plain", tiny_llama, examples, **options)
    args = make_args(str(tmp_path / "p"), weighting="proportional", **options)
    assert max_relative_difference(plain, minimax_grads(tiny_llama(), args, examples)) <= 1e-5


@pytest.mark.slow
def test_two_gloo_processes_give_the_plain_trainer_gradient(tmp_path):
    """2 processes x 2 examples x 2 micro-batches (rows of different lengths): the plain Trainer's gradient."""
    assert_two_gloo_processes_give_plain_trainer_grads(tmp_path)


def test_each_domain_loss_is_the_mean_next_token_loss_of_its_sequences(tmp_path):
    examples = domain_examples(6)
    trainer = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path), weighting="average"))
    loss = one_step(trainer, examples)
    losses, domains = next_token_losses(tiny_llama(), examples)
    assert trainer._step_counts.tolist() == torch.bincount(domains, minlength=3).tolist()
    expected = torch.stack([losses[domains == t].mean() for t in range(3)]).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_token_level_task_ids_are_those_of_the_predicted_tokens(tmp_path):
    """Packed rows, domain 0 then domain 1: the target predicting domain 1's first token is domain 1's."""
    examples = domain_examples(4)
    examples["task_ids"] = (torch.arange(SEQ) >= SEQ // 2).long().expand(4, SEQ).clone()
    examples["attention_mask"][:], examples["labels"] = 1, examples["input_ids"].clone()
    trainer = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path), weighting="average"))
    loss = one_step(trainer, examples)
    assert trainer._step_counts.tolist() == [4 * (SEQ // 2 - 1), 4 * SEQ // 2, 0]
    losses, domains = next_token_losses(tiny_llama(), examples)
    expected = (losses[domains == 0].mean() + losses[domains == 1].mean()) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_shift_labels_in_the_batch_are_the_targets_as_given(tmp_path):
    """A collator's ``shift_labels`` (here: the labels shifted, the last 4 targets of each row left out) are used
    unshifted, as ``ForCausalLMLoss`` uses them; ``proportional`` then equals the model's own loss."""
    examples = domain_examples(4)
    shift_labels = torch.nn.functional.pad(examples["labels"][:, 1:], (0, 1), value=-100)
    shift_labels[:, -5:] = -100
    trainer = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path), weighting="proportional"))
    loss = one_step(trainer, {**examples, "shift_labels": shift_labels})
    expected = tiny_llama()(**{k: v for k, v in examples.items() if k != "task_ids"}, shift_labels=shift_labels).loss
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_shift_labels_for_a_masked_lm_are_refused(tmp_path):
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(str(tmp_path)))
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)}
    with pytest.raises(ValueError, match="shift_labels"):
        one_step(trainer, {**batch, "task_ids": torch.zeros(2, dtype=torch.long), "shift_labels": batch["labels"]})


def test_evaluate_reports_each_domain_loss_and_perplexity(tmp_path):
    examples = domain_examples(7, seed=3)
    args = make_args(str(tmp_path), per_device_eval_batch_size=4)
    metrics = MinimaxTrainer(model=tiny_qwen2(), args=args, eval_dataset=as_dataset(examples)).evaluate()
    with torch.no_grad():
        losses, domains = next_token_losses(tiny_qwen2(), examples)
    expected = {name: losses[domains == t].mean().item() for t, name in enumerate(DOMAINS)}
    for name, value in expected.items():
        assert metrics[f"eval_task_loss/{name}"] == pytest.approx(value, rel=1e-6)
        assert metrics[f"eval_task_perplexity/{name}"] == pytest.approx(math.exp(value), rel=1e-6)
    assert metrics["eval_mean_task_loss"] == pytest.approx(sum(expected.values()) / 3, rel=1e-6)
    assert metrics["eval_worst_task_loss"] == pytest.approx(max(expected.values()), rel=1e-6)
    assert metrics["eval_worst_task_perplexity"] == pytest.approx(math.exp(max(expected.values())), rel=1e-6)


def test_minimax_trains_gpt2_with_weights_that_follow_the_domain_losses(tmp_path):
    """Each step's weights are softmax(alpha * the step's domain losses); the hardest domain ends with the most."""
    args = make_args(str(tmp_path), alpha=4.0, per_device_train_batch_size=24, max_steps=12, learning_rate=1e-2)
    trainer = MinimaxTrainer(model=tiny_gpt2(), args=args, train_dataset=as_dataset(domain_examples(24)))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 12
    for entry in logs:
        losses = torch.tensor([entry[f"task_loss/{name}"] for name in DOMAINS])
        weights = torch.tensor([entry[f"task_weight/{name}"] for name in DOMAINS])
        assert torch.allclose(weights, torch.softmax(4.0 * losses, 0), atol=1e-5), entry
    last = [logs[-1][f"task_loss/{name}"] for name in DOMAINS]
    assert last[0] < last[2] and max(range(3), key=lambda t: logs[-1][f"task_weight/{DOMAINS[t]}"]) == 2
