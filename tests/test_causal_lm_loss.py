"""Chunked next-token losses (``causal_lm_chunk_size``): the losses and gradients of the full logits, without them."""

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from accelerate.utils import DistributedType
from peft import LoraConfig, get_peft_model
from ports import free_port
from processes import TESTS, checkout_env
from safetensors.torch import load_file
from test_causal_lm import LAUNCH, assert_two_gloo_processes_give_plain_trainer_grads, plain_trainer_grads
from test_trainer import max_relative_difference, one_step
from tiny_causal_lm import (
    LLAMA_STYLE_SIZE,
    GradRecorder,
    as_dataset,
    domain_examples,
    make_args,
    minimax_grads,
    tiny_gpt2,
    tiny_llama,
    tiny_qwen2,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaForCausalLM,
    RecurrentGemmaConfig,
    RecurrentGemmaForCausalLM,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from robust_pretrain import MinimaxTrainer
from robust_pretrain.trainer.next_token_loss import CHUNK_RANGE, LogitTransform, chunked_head_losses, default_chunk_size

N, HIDDEN, VOCAB = 13, 8, 11
CAPPED = LogitTransform(scale=0.5, softcap=2.0)


def reference_losses(hidden, head, targets, transform: LogitTransform, smoothing: float) -> torch.Tensor:
    """The unchunked loss, with autograd: full logits, scaled and soft-capped as the models do, then cross-entropy."""
    logits = head(hidden).float() * transform.scale
    if transform.softcap is not None:
        logits = transform.softcap * torch.tanh(logits / transform.softcap)
    return F.cross_entropy(logits, targets, reduction="none", label_smoothing=smoothing)


def losses_and_grads(compute, dtype=torch.float32) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-target losses of ``compute(hidden, head, targets)`` and the gradients of ``sum_i g_i * loss_i`` (random
    ``g``: each target weighs differently, as tasks with different weights and counts do)."""
    torch.manual_seed(0)
    hidden = (3 * torch.randn(N, HIDDEN, dtype=dtype)).requires_grad_()
    head = torch.nn.Linear(HIDDEN, VOCAB, dtype=dtype)
    targets = torch.randint(0, VOCAB, (N,))
    upstream = torch.rand(N, dtype=torch.float32)
    losses = compute(hidden, head, targets)
    (losses * upstream).sum().backward()
    return losses.detach(), [hidden.grad, head.weight.grad, head.bias.grad]


@pytest.mark.parametrize("chunk_size", [1, 4, N, 64])
@pytest.mark.parametrize("transform", [LogitTransform(), CAPPED], ids=["identity", "scaled-capped"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_losses_and_gradients_equal_those_of_the_full_logits(chunk_size, transform, smoothing):
    expected, expected_grads = losses_and_grads(lambda h, head, y: reference_losses(h, head, y, transform, smoothing))
    losses, grads = losses_and_grads(
        lambda h, head, y: chunked_head_losses(h, head, y, chunk_size, transform, smoothing)
    )
    assert losses.dtype == torch.float32
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    for grad, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)


def test_gradients_pass_the_float64_gradient_check():
    """Finite differences of the chunked function itself (not compared with another implementation)."""
    torch.manual_seed(1)
    hidden = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(3, 4, dtype=torch.float64)
    targets = torch.tensor([0, 3, 1, 1, 2])

    weight = head.weight.detach().clone().requires_grad_()
    bias = head.bias.detach().clone().requires_grad_()
    del head.weight, head.bias  # plain tensors in their place, so gradcheck can vary them

    def losses(h, w, b):
        head.weight, head.bias = w, b
        return chunked_head_losses(h, head, targets, 2, CAPPED, 0.2)

    assert torch.autograd.gradcheck(losses, (hidden, weight, bias))


def test_under_bf16_autocast_the_head_runs_in_bf16_and_the_softmax_in_fp32():
    torch.manual_seed(2)
    hidden, head, targets = torch.randn(N, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB), torch.randint(0, VOCAB, (N,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.cross_entropy(head(hidden).float(), targets, reduction="none")
        losses = chunked_head_losses(hidden, head, targets, 4)
    torch.testing.assert_close(losses, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(losses, F.cross_entropy(head(hidden), targets, reduction="none"), rtol=1e-6, atol=0)


@pytest.mark.parametrize("make_model", [tiny_gpt2, tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_proportional_in_chunks_gives_the_plain_trainer_gradient(tmp_path, make_model, accumulation):
    """Chunks of 5 positions (not a divisor of any micro-batch's target count): the model's own loss's gradient."""
    examples = domain_examples(8)
    options = dict(per_device_train_batch_size=8 // accumulation, gradient_accumulation_steps=accumulation)
    plain = plain_trainer_grads(tmp_path / "plain", make_model, examples, **options)
    args = make_args(str(tmp_path / "p"), weighting="proportional", causal_lm_chunk_size=5, **options)
    assert max_relative_difference(plain, minimax_grads(make_model(), args, examples)) <= 1e-5


def lora_llama() -> torch.nn.Module:
    return get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


@pytest.mark.parametrize(
    ("make_model", "options"),
    [
        (tiny_llama, dict(alpha=3.0)),
        (tiny_llama, dict(alpha=3.0, label_smoothing_factor=0.1)),
        (tiny_llama, dict(weighting="gradnorm")),  # per-task gradients: the chunked backward runs once per task
        (lora_llama, dict(alpha=3.0)),
    ],
    ids=["minimax", "minimax-smoothing", "gradnorm", "minimax-lora"],
)
def test_task_weights_in_chunks_give_the_full_logits_gradient(tmp_path, make_model, options):
    examples = domain_examples(8)
    options = dict(options, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    full = minimax_grads(make_model(), make_args(str(tmp_path / "f"), causal_lm_chunk_size=0, **options), examples)
    chunked = minimax_grads(make_model(), make_args(str(tmp_path / "c"), causal_lm_chunk_size=3, **options), examples)
    assert max_relative_difference(full, chunked) <= 1e-5


def test_bf16_training_in_chunks_matches_the_full_logits(tmp_path):
    """``--bf16`` (autocast on CPU): the head's matmul in bf16 both ways, the losses in fp32; the chunked gradient is
    closer to the full logits' than bf16 itself is to fp32 (measured: 1.4e-3 against 3.7e-3)."""
    examples = domain_examples(8)
    options = dict(weighting="minimax", per_device_train_batch_size=8)
    fp32 = minimax_grads(tiny_llama(), make_args(str(tmp_path / "32"), causal_lm_chunk_size=0, **options), examples)
    options["bf16"] = True
    full = minimax_grads(tiny_llama(), make_args(str(tmp_path / "f"), causal_lm_chunk_size=0, **options), examples)
    chunked = minimax_grads(tiny_llama(), make_args(str(tmp_path / "c"), causal_lm_chunk_size=5, **options), examples)
    assert max_relative_difference(full, chunked) < max_relative_difference(fp32, full)


def tiny_gemma2() -> Gemma2ForCausalLM:
    torch.manual_seed(0)
    size = {**LLAMA_STYLE_SIZE, "head_dim": 16}
    return Gemma2ForCausalLM(Gemma2Config(**size, final_logit_softcapping=0.5, attn_logit_softcapping=None))


def tiny_cohere() -> CohereForCausalLM:
    torch.manual_seed(0)
    return CohereForCausalLM(CohereConfig(**LLAMA_STYLE_SIZE, logit_scale=4.0))


def tiny_granite() -> GraniteForCausalLM:
    torch.manual_seed(0)
    return GraniteForCausalLM(GraniteConfig(**LLAMA_STYLE_SIZE, logits_scaling=0.25))


def tiny_recurrent_gemma() -> RecurrentGemmaForCausalLM:
    torch.manual_seed(0)
    size = {k: v for k, v in LLAMA_STYLE_SIZE.items() if k != "max_position_embeddings"}
    config = RecurrentGemmaConfig(
        **size, head_dim=16, lru_width=32, attention_window_size=16, block_types=["recurrent", "attention"]
    )
    config.logits_soft_cap = 0.5
    return RecurrentGemmaForCausalLM(config)


@pytest.mark.parametrize(
    ("make_model", "transform"),
    [
        (tiny_gemma2, LogitTransform(softcap=0.5)),
        (tiny_recurrent_gemma, LogitTransform(softcap=0.5)),
        (tiny_cohere, LogitTransform(scale=4.0)),
        (tiny_granite, LogitTransform(scale=4.0)),
    ],
)
def test_soft_capped_and_scaled_logits_give_the_models_own_loss(tmp_path, make_model, transform):
    """Gemma 2's and RecurrentGemma's soft-caps, Cohere's ``logit_scale``, Granite's ``logits_scaling`` are read from
    the config; without
    them the check against the model's own logits refuses to go on."""
    examples = domain_examples(6)
    args = make_args(str(tmp_path), weighting="proportional", causal_lm_chunk_size=7)
    trainer = MinimaxTrainer(model=make_model(), args=args)
    assert trainer.lm_loss.transform == transform
    loss = one_step(trainer, examples)
    own = make_model()(**{k: v for k, v in examples.items() if k != "task_ids"}).loss
    assert loss.item() == pytest.approx(own.item(), rel=1e-6)
    unaware = MinimaxTrainer(model=make_model(), args=args)
    unaware.lm_loss.transform = LogitTransform()
    with pytest.raises(ValueError, match="are not its output embeddings' output transformed as its config declares"):
        one_step(unaware, examples)


class DoubledLogits(LlamaForCausalLM):
    """A head the config does not describe: the logits doubled after ``lm_head``."""

    def forward(self, **kwargs):
        outputs = super().forward(**kwargs)
        outputs.logits = 2 * outputs.logits
        return outputs


def test_a_head_that_does_more_than_its_config_says_is_refused(tmp_path):
    trainer = MinimaxTrainer(model=DoubledLogits(tiny_llama().config), args=make_args(str(tmp_path)))
    with pytest.raises(ValueError, match=r"causal_lm_chunk_size: the logits of DoubledLogits .* set causal_lm_chunk"):
        one_step(trainer, domain_examples(3))


class QuietlyCapped(LlamaForCausalLM):
    """A soft-cap the config does not declare: invisible while the logits are far below the cap."""

    def forward(self, **kwargs):
        outputs = super().forward(**kwargs)
        outputs.logits = 30 * torch.tanh(outputs.logits / 30)
        return outputs


def test_the_head_is_checked_again_as_training_goes_on(tmp_path):
    """The first forward pass passes the check (logits ~0.5 against a cap of 30); once the logits grow, a later
    check (forward passes 1, 2, 4, ...) refuses to go on."""
    trainer = MinimaxTrainer(model=QuietlyCapped(tiny_llama().config), args=make_args(str(tmp_path)))
    one_step(trainer, domain_examples(3))
    with torch.no_grad():
        trainer.model.lm_head.weight.mul_(1000)
    with pytest.raises(ValueError, match=r"the logits of QuietlyCapped are not its output embeddings' output"):
        one_step(trainer, domain_examples(3))


class TwoHeads(LlamaForCausalLM):
    """Next-token logits from two passes through ``lm_head`` (as multi-token prediction heads make)."""

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return CausalLMOutputWithPast(logits=self.lm_head(hidden) + self.lm_head(hidden.flip(1)))


def test_a_head_that_runs_twice_is_refused(tmp_path):
    trainer = MinimaxTrainer(model=TwoHeads(tiny_llama().config), args=make_args(str(tmp_path)))
    with pytest.raises(ValueError, match="causal_lm_chunk_size: the output embeddings of TwoHeads ran twice"):
        one_step(trainer, domain_examples(3))


def test_an_adapted_head_is_refused_and_the_full_logits_remain_an_option(tmp_path):
    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="causal_lm_chunk_size: the output embeddings of LlamaForCausalLM are a"):
        MinimaxTrainer(model=model, args=make_args(str(tmp_path)))
    assert MinimaxTrainer(model=model, args=make_args(str(tmp_path), causal_lm_chunk_size=0)).lm_loss is None


def saved_logit_rows(trainer, examples) -> tuple[int, torch.Size]:
    """Rows of vocabulary logits (tensors ending in a vocabulary dimension) that the step's forward pass keeps for
    backward, at most, and the shape of the logits the model returns."""
    vocab = LLAMA_STYLE_SIZE["vocab_size"]
    parameters = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    rows = [0]

    def keep(saved: torch.Tensor) -> torch.Tensor:
        if saved.dim() and saved.shape[-1] == vocab and saved.untyped_storage().data_ptr() not in parameters:
            rows.append(saved.numel() // vocab)
        return saved

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        trainer.model.train()
        samples, _ = trainer.get_batch_samples(iter([examples]), 1, torch.device("cpu"))
        trainer.current_gradient_accumulation_steps = 1
        loss, outputs = trainer.compute_loss(trainer.model, dict(samples[0]), return_outputs=True)
    loss.backward()
    return max(rows), outputs.logits.shape


def test_no_logits_of_every_position_are_kept_for_the_backward_pass(tmp_path):
    examples = domain_examples(8)
    targets = int((examples["labels"][:, 1:] != -100).sum())
    vocab = LLAMA_STYLE_SIZE["vocab_size"]
    full = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path), causal_lm_chunk_size=0))
    assert saved_logit_rows(full, examples) == (targets, (8, 16, vocab))  # the targets' logits, for cross-entropy
    chunked = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path), causal_lm_chunk_size=4))
    assert saved_logit_rows(chunked, examples) == (0, (8, 1, vocab))  # logits of the first position only, not saved


def test_predictions_collected_in_evaluation_get_the_full_logits(tmp_path):
    examples = as_dataset(domain_examples(5))
    chunked = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path / "c"), causal_lm_chunk_size=4))
    assert chunked.predict(examples).predictions.shape == (5, 16, LLAMA_STYLE_SIZE["vocab_size"])
    full = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path / "f"), causal_lm_chunk_size=0))
    assert chunked.evaluate(examples)["eval_loss"] == pytest.approx(full.evaluate(examples)["eval_loss"], rel=1e-6)


@pytest.mark.slow
def test_two_gloo_processes_in_chunks_give_the_plain_trainer_gradient(tmp_path):
    assert_two_gloo_processes_give_plain_trainer_grads(tmp_path, "--chunk_size", "5")


def test_under_torch_compile_the_chunked_loss_gives_the_eager_gradient(tmp_path):
    """``torch_compile`` keeps the chunked loss on: AOT autograd (compile's forward/backward tracing; ``aot_eager``
    runs its graphs with eager kernels) gives the eager step's gradient exactly. (Inductor on the CPU: within 4e-8,
    measured once; 3 minutes to compile, too slow for the suite.)"""
    examples = domain_examples(8)
    eager = minimax_grads(tiny_llama(), make_args(str(tmp_path / "e"), causal_lm_chunk_size=4), examples)
    args = make_args(str(tmp_path / "c"), causal_lm_chunk_size=4, torch_compile=True, torch_compile_backend="aot_eager")
    trainer = MinimaxTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(examples))
    recorder = GradRecorder(trainer)
    trainer.train()
    assert trainer.lm_loss is not None and trainer.lm_loss.forward_passes > 0  # the chunked path ran
    assert max(float((eager[k] - recorder.grads[k]).abs().max()) for k in eager) == 0.0


@pytest.mark.slow
def test_fsdp2_keeps_the_chunked_loss_and_gives_the_ddp_gradient(tmp_path):
    """2 gloo processes: FSDP2 (``fully_shard`` per decoder layer and the root, which holds ``lm_head``) with the
    chunked loss gives the DDP run's first-step gradients (gathered from the shards) and per-domain losses."""
    runs = {}
    for name, extra in (("ddp", []), ("fsdp2", ["--fsdp2"])):
        out = tmp_path / name
        command = [*LAUNCH, "--master_port", str(free_port()), str(TESTS / "tiny_causal_lm.py"), "--out", str(out)]
        options = ["--chunk_size", "5", "--weighting", "minimax", *extra]
        subprocess.run([*command, *options], check=True, env=checkout_env(OMP_NUM_THREADS="1"))
        runs[name] = [json.loads((out / f"run-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [run["wrapped_model"] for run in runs["fsdp2"]] == ["FSDPLlamaForCausalLM"] * 2
    assert all(run["chunked_forward_passes"] > 0 for runs_ in runs.values() for run in runs_)
    ddp = load_file(tmp_path / "ddp" / "grads-rank0.safetensors")
    for rank in (0, 1):
        sharded = load_file(tmp_path / "fsdp2" / f"grads-rank{rank}.safetensors")
        assert sorted(sharded) == sorted(ddp) and max_relative_difference(ddp, sharded) <= 1e-6
        assert runs["fsdp2"][rank]["task_losses"] == pytest.approx(runs["ddp"][0]["task_losses"], abs=1e-6)


@pytest.mark.slow
def test_under_fsdp2_the_reference_model_is_sharded_and_gives_the_ddp_reference_losses(tmp_path):
    """2 gloo processes, 3 steps of minimax over the online excess of a ``--reference_model``: under FSDP2 the
    reference is sharded like the model (``fully_shard`` per decoder layer and the root), each process holding half
    its parameters, and its per-domain losses, hence the excess and the weights, are the DDP run's."""
    reference = tmp_path / "reference"
    tiny_llama(seed=3).save_pretrained(reference)
    runs = {}
    for name, extra in (("ddp", []), ("fsdp2", ["--fsdp2"])):
        out = tmp_path / name
        command = [*LAUNCH, "--master_port", str(free_port()), str(TESTS / "tiny_causal_lm.py"), "--out", str(out)]
        options = ["--chunk_size", "5", "--weighting", "minimax", "--max_steps", "3", "--reference_model", reference]
        subprocess.run([*command, *options, *extra], check=True, env=checkout_env(OMP_NUM_THREADS="1"))
        runs[name] = [json.loads((out / f"run-rank{rank}.json").read_text()) for rank in (0, 1)]
    ddp = runs["ddp"][0]
    total = ddp["reference_parameters"]["total"]
    assert ddp["reference_class"] == "LlamaForCausalLM" and ddp["reference_parameters"]["local"] == total
    for run in runs["fsdp2"]:
        assert run["reference_class"] == "FSDPLlamaForCausalLM" and run["reference_parameters"]["total"] == total
        assert abs(run["reference_parameters"]["local"] - total / 2) <= 0.01 * total  # about half, per process
        assert len(run["reference_losses"]) == 3 and run["chunked_forward_passes"] > 0
        assert torch.tensor(run["reference_losses"]).sub(torch.tensor(ddp["reference_losses"])).abs().max() <= 1e-6
        assert torch.tensor(run["weights"]).sub(torch.tensor(ddp["weights"])).abs().max() <= 1e-6


@pytest.mark.parametrize("engine", ["FSDP2", "FSDP1", "DeepSpeed"])
def test_fsdp2_attaches_the_chunked_loss_fsdp1_and_deepspeed_are_refused_with_the_reason(tmp_path, engine):
    trainer = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path)))
    state = trainer.accelerator.state
    saved = state.distributed_type, getattr(state, "fsdp_plugin", None)
    try:
        if engine == "DeepSpeed":
            state.distributed_type = DistributedType.DEEPSPEED
        else:
            version = int(engine[-1])
            state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, SimpleNamespace(fsdp_version=version)
        if engine == "FSDP2":
            assert trainer._chunked_lm_loss() is not None
        else:
            with pytest.raises(ValueError, match=rf"not supported with {engine}, which flattens or partitions .*FSDP2"):
                trainer._chunked_lm_loss()
    finally:
        state.distributed_type, state.fsdp_plugin = saved


def test_output_embeddings_sharded_in_a_unit_of_their_own_are_refused(tmp_path):
    """A head FSDP2 shards on its own is still a DTensor shard when the hook runs (its gather is a later hook)."""
    trainer = MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path)))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, store=torch.distributed.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        head = torch.nn.Linear(32, LLAMA_STYLE_SIZE["vocab_size"], bias=False)
        head.weight = torch.nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [Shard(0)]))
        hidden = torch.randn(2, 3, 32)
        with trainer.lm_loss.targets(torch.ones(2, 3, dtype=torch.bool), torch.zeros(6, dtype=torch.long)):
            with pytest.raises(ValueError, match="are sharded in an FSDP unit of their own; shard them with the root"):
                trainer.lm_loss._compute_losses(head, (hidden,))
    finally:
        torch.distributed.destroy_process_group()


def test_the_reference_model_runs_through_the_chunked_loss(tmp_path):
    """``--reference_model`` with a causal LM: the reference's per-target losses come from the same sliced path (its
    forward returns first-position logits only: the full logits never exist) and equal the full-logits ones."""
    reference = tmp_path / "reference"
    tiny_llama(seed=3).save_pretrained(reference)
    options = dict(weighting="minimax", loss_normalization="excess", reference_model=str(reference))
    sums, lengths = {}, {}
    for chunk in (0, 4):
        args = make_args(str(tmp_path / str(chunk)), causal_lm_chunk_size=chunk, **options)
        trainer = MinimaxTrainer(model=tiny_llama(), args=args)
        assert (trainer.reference_lm_loss is not None) == bool(chunk)
        seen = lengths.setdefault(chunk, [])
        trainer.reference.model.register_forward_hook(lambda module, args, output, seen=seen: seen.append(output))
        samples, _ = trainer.get_batch_samples(iter([domain_examples(6)]), 1, torch.device("cpu"))
        sums[chunk] = trainer._reference_sums(dict(samples[0]))
        lengths[chunk] = seen[0].logits.shape[1]
    assert lengths == {0: 16, 4: 1}
    torch.testing.assert_close(sums[4], sums[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("targets", "vocab", "hidden", "expected"),
    [
        (8192, 128_256, 2048, 256),  # Llama-3 head, 4 x 2,048 tokens: ceil(8192 / 63) = 131 -> 256
        (8192, 128_256, 1024, 128),  # ceil(8192 / 126) = 66 -> 128
        (16384, 50_257, 4096, 2048),  # ceil(16384 / 13) = 1261 -> 2048
        (1024, 32_000, 64, 128),  # ceil(1024 / 500) = 3 -> 4, raised to the floor
        (65536, 32_000, 4096, 8192),  # ceil(65536 / 8) = 8192
        (131072, 32_000, 4096, 8192),  # 16384, lowered to the ceiling
        (100, 128, 32, 128),  # the tiny test decoders: ceil(100 / 4) = 25 -> 32, raised to the floor
    ],
)
def test_the_default_chunk_size_follows_the_shapes(targets, vocab, hidden, expected):
    assert default_chunk_size(targets, vocab, hidden) == expected
    assert CHUNK_RANGE[0] <= expected <= CHUNK_RANGE[1] and expected & (expected - 1) == 0


@pytest.mark.parametrize("option", [None, 4])
def test_unset_the_chunk_size_comes_from_the_shapes_and_an_explicit_one_wins(tmp_path, option):
    """Unset, each forward pass takes :func:`default_chunk_size` of its targets and head, logged with the losses;
    an explicit ``causal_lm_chunk_size`` is used as given."""
    examples = domain_examples(8)
    targets = int((examples["labels"][:, 1:] != -100).sum())
    chunking = {} if option is None else {"causal_lm_chunk_size": option}
    trainer = MinimaxTrainer(
        model=tiny_llama(), args=make_args(str(tmp_path), **chunking), train_dataset=as_dataset(examples)
    )
    trainer.train()
    expected = option or default_chunk_size(targets, LLAMA_STYLE_SIZE["vocab_size"], LLAMA_STYLE_SIZE["hidden_size"])
    assert trainer.lm_loss.chunk_size == option and trainer.lm_loss.last_chunk_size == expected
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert logged["causal_lm_chunk_size"] == expected


def test_the_backward_writes_the_gradients_in_place_without_product_temporaries():
    """fp32: each slice's ``grad_weight`` rows are written by ``mm`` into the gradient itself and the hidden states'
    gradient accumulated by ``addmm_``: no functional matrix product (a ``[width, hidden]`` or ``[targets, hidden]``
    temporary per slice) runs in the backward pass; the values are checked against the full logits above."""
    torch.manual_seed(3)
    hidden = torch.randn(N, HIDDEN, requires_grad=True)
    head, targets = torch.nn.Linear(HIDDEN, VOCAB), torch.randint(0, VOCAB, (N,))
    losses = chunked_head_losses(hidden, head, targets, 2)

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        losses.sum().backward()
    assert "aten.mm.out" in ops.names and "aten.addmm_.default" in ops.names
    assert "aten.mm.default" not in ops.names, ops.names
