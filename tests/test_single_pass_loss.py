"""The single-pass head loss (:mod:`robust_pretrain.trainer.single_pass_loss`): the head's gradients computed in the
forward pass equal those of the full fp32 logits, in the function and in the trainer wherever the weights are known."""

import json
import subprocess

import pytest
import torch
from ports import free_port
from processes import TESTS, checkout_env
from safetensors.torch import load_file
from test_causal_lm import LAUNCH
from test_causal_lm_loss import CAPPED, HIDDEN, VOCAB, N, reference_losses
from test_trainer import max_relative_difference
from tiny_causal_lm import GradRecorder, as_dataset, domain_examples, make_args, minimax_grads, tiny_llama

from robust_pretrain import MinimaxTrainer
from robust_pretrain.trainer.next_token_loss import LogitTransform
from robust_pretrain.trainer.single_pass_loss import single_pass_head_losses


def losses_and_grads(compute, factor: float = 0.5, skew: torch.Tensor | None = None):
    """Per-target losses of ``compute(hidden, head, targets, scales)`` and the gradients of ``sum_i g_i loss_i`` with
    ``g = factor * scales`` (random scales: tasks of different weights and counts; ``skew``: g's deviation)."""
    torch.manual_seed(0)
    hidden = (3 * torch.randn(N, HIDDEN)).requires_grad_()
    head = torch.nn.Linear(HIDDEN, VOCAB)
    targets = torch.randint(0, VOCAB, (N,))
    scales = torch.rand(N)
    scales[2] = 0.0  # a task of weight 0
    upstream = factor * scales + (0 if skew is None else skew)
    losses = compute(hidden, head, targets, scales)
    (losses * upstream).sum().backward()
    return losses.detach(), [hidden.grad, head.weight.grad, head.bias.grad]


@pytest.mark.parametrize("chunk_size", [1, 4, N, 64])
@pytest.mark.parametrize("transform", [LogitTransform(), CAPPED], ids=["identity", "scaled-capped"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_single_pass_losses_and_gradients_equal_those_of_the_full_logits(chunk_size, transform, smoothing):
    expected, expected_grads = losses_and_grads(
        lambda h, head, y, s: reference_losses(h, head, y, transform, smoothing)
    )
    losses, grads = losses_and_grads(
        lambda h, head, y, s: single_pass_head_losses(h, head, y, s, chunk_size, transform, smoothing)
    )
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    for grad, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)


def test_gradients_not_proportional_to_the_declared_scales_are_refused():
    skew = torch.zeros(N)
    skew[0] = 0.3
    with pytest.raises(ValueError, match="not its targets' scales times one factor"):
        losses_and_grads(lambda h, head, y, s: single_pass_head_losses(h, head, y, s, 4), skew=skew)


def trained(tmp_path, name: str, examples: dict, **options) -> tuple[MinimaxTrainer, dict[str, torch.Tensor]]:
    """A 1-step run of a tiny Llama and its gradients."""
    trainer = MinimaxTrainer(
        model=tiny_llama(), args=make_args(str(tmp_path / name), **options), train_dataset=as_dataset(examples)
    )
    recorder = GradRecorder(trainer)
    trainer.train()
    return trainer, recorder.grads


@pytest.mark.parametrize(
    ("options", "single_passes"),
    [
        (dict(weighting="proportional", gradient_accumulation_steps=1), 1),  # weights known at the first micro-batch
        (dict(weighting="average", gradient_accumulation_steps=2), 2),
        (dict(weighting="uncertainty", gradient_accumulation_steps=2), 2),  # learnable: known before the forward
        (dict(alpha=3.0, gradient_accumulation_steps=2), 1),  # alternating minimax: the second micro-batch
        (dict(alpha=3.0, gradient_accumulation_steps=4, full_determinism=True), 3),
        (dict(alpha=3.0, gradient_accumulation_steps=2, label_smoothing_factor=0.1), 1),
        (dict(alpha=3.0, gradient_accumulation_steps=2, weight_update="simultaneous"), 2),
        (dict(weighting="group_dro", gradient_accumulation_steps=2, weight_update="simultaneous"), 2),
        (dict(weighting="uncertainty", gradient_accumulation_steps=1, weight_update="simultaneous"), 1),
    ],
    ids=lambda value: None if isinstance(value, int) else "-".join(f"{k}={v}" for k, v in value.items()),
)
def test_the_trainer_takes_the_single_pass_where_the_weights_are_known_with_the_full_logits_gradient(
    tmp_path, options, single_passes
):
    """The first step's gradients equal those of the full fp32 logits (``causal_lm_chunk_size=0``) with the same
    options, and the single pass ran on exactly the micro-batches whose weights were known before the forward."""
    examples = domain_examples(8)
    options = dict(options, per_device_train_batch_size=8 // options["gradient_accumulation_steps"], max_steps=1)
    full = trained(tmp_path, "full", examples, causal_lm_chunk_size=0, **options)[1]
    trainer, grads = trained(tmp_path, "chunked", examples, causal_lm_chunk_size=5, **options)
    assert trainer.lm_loss.single_passes == single_passes
    assert max_relative_difference(full, grads) <= 1e-5


def test_gradnorm_keeps_the_recomputing_path(tmp_path):
    """GradNorm differentiates each task's loss alone: its per-task gradients are not the objective's."""
    trainer, _ = trained(
        tmp_path,
        "g",
        domain_examples(8),
        weighting="gradnorm",
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        causal_lm_chunk_size=5,
    )
    assert trainer.lm_loss.forward_passes == 2 and trainer.lm_loss.single_passes == 0


def test_under_torch_compile_the_single_pass_gives_the_eager_gradient(tmp_path):
    """AOT autograd traces the single-pass function (its gradients made in the forward) as eager runs it."""
    examples = domain_examples(8)
    options = dict(weighting="proportional", causal_lm_chunk_size=4)
    eager = minimax_grads(tiny_llama(), make_args(str(tmp_path / "e"), **options), examples)
    trainer, compiled = trained(
        tmp_path, "c", examples, torch_compile=True, torch_compile_backend="aot_eager", **options
    )
    assert trainer.lm_loss.single_passes > 0
    assert max(float((eager[k] - compiled[k]).abs().max()) for k in eager) == 0.0


@pytest.mark.slow
def test_fsdp2_with_the_single_pass_gives_the_full_logits_ddp_gradient(tmp_path):
    """2 gloo processes, minimax under the simultaneous order with accumulation 2: FSDP2 (``fully_shard`` per decoder
    layer and the root, which holds ``lm_head``) on the single-pass path gives the first-step gradients (gathered
    from the shards) and per-domain losses of DDP on the full fp32 logits."""
    runs = {}
    for name, extra in (("ddp", ["--chunk_size", "0"]), ("fsdp2", ["--fsdp2", "--chunk_size", "5"])):
        out = tmp_path / name
        command = [*LAUNCH, "--master_port", str(free_port()), str(TESTS / "tiny_causal_lm.py"), "--out", str(out)]
        options = ["--weighting", "minimax", "--weight_update", "simultaneous", "--batch_size", "2"]
        options += ["--grad_accum", "2"]
        subprocess.run([*command, *options, *extra], check=True, env=checkout_env(OMP_NUM_THREADS="1"))
        runs[name] = [json.loads((out / f"run-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [run["wrapped_model"] for run in runs["fsdp2"]] == ["FSDPLlamaForCausalLM"] * 2
    assert [run["single_passes"] for run in runs["fsdp2"]] == [2, 2]  # both micro-batches of each process
    full = load_file(tmp_path / "ddp" / "grads-rank0.safetensors")
    for rank in (0, 1):
        sharded = load_file(tmp_path / "fsdp2" / f"grads-rank{rank}.safetensors")
        assert sorted(sharded) == sorted(full) and max_relative_difference(full, sharded) <= 1e-5
        assert runs["fsdp2"][rank]["task_losses"] == pytest.approx(runs["ddp"][0]["task_losses"], abs=1e-6)


def logged_weights(trainer: MinimaxTrainer) -> list[tuple[float, ...]]:
    """Each logged step's task weights."""
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    return [tuple(value for key, value in sorted(e.items()) if key.startswith("task_weight/")) for e in history]


def test_simultaneous_resume_continues_exactly(tmp_path):
    """4 steps of minimax under the simultaneous order, and 2 + 2 resumed from the checkpoint of step 2 (which keeps
    step 2's losses, the input of step 3's weights): the same weights at every step and the same final model."""
    examples = domain_examples(32)
    options = dict(
        alpha=3.0, weight_update="simultaneous", causal_lm_chunk_size=5, per_device_train_batch_size=4, max_steps=4,
        save_strategy="steps", save_steps=2, logging_steps=1,
    )  # fmt: skip

    def run(name: str, resume: bool = False) -> MinimaxTrainer:
        trainer = MinimaxTrainer(
            model=tiny_llama(), args=make_args(str(tmp_path / name), **options), train_dataset=as_dataset(examples)
        )
        trainer.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2") if resume else None)
        return trainer

    straight, resumed = run("straight"), run("resumed", resume=True)
    weights, again = logged_weights(straight), logged_weights(resumed)
    assert len(set(weights)) == 4  # the weights move at every step
    assert again[-2:] == weights[-2:]
    final = dict(straight.model.named_parameters())
    assert max(float((p - final[n]).detach().abs().max()) for n, p in resumed.model.named_parameters()) == 0.0


def test_simultaneous_gradnorm_is_refused():
    with pytest.raises(ValueError, match="weight_update='simultaneous': weighting='gradnorm' weighs by this step's"):
        make_args("unused", weighting="gradnorm", weight_update="simultaneous")


def test_importance_weighting_takes_the_single_pass_with_the_expected_gradient(tmp_path):
    """Fixed sampling weights q toward a fixed objective w (importance weighting, scales ``w_t / q_t / N``): the
    enumeration test's exact expectation holds with every step on the single pass."""
    from test_task_sampling import test_importance_weighting_gives_the_w_weighted_gradient_in_expectation as check

    passes = []
    original = MinimaxTrainer._task_sums

    def recording(self, model, inputs, reference=False):
        result = original(self, model, inputs, reference)
        passes.append((self.lm_loss.forward_passes, self.lm_loss.single_passes))
        return result

    MinimaxTrainer._task_sums = recording
    try:
        check(tmp_path)
    finally:
        MinimaxTrainer._task_sums = original
    assert passes[-1] == (9, 9)
